//! Sentinel (feature `sentinel`): the master is resolved from the Sentinels on every new
//! connection; a connection that hits `READONLY` (a demoted master) or fails is replaced,
//! which resolves the master again. A task ([`SwitchWatch`]) listens for the Sentinels'
//! `+switch-master` of the service and counts switches: a connection opened before the
//! latest switch is stale and gets replaced before its next command, because a demoted
//! master keeps accepting writes for seconds after the switch (for ever, when it is cut
//! off from the Sentinels). The task asks its Sentinel for the master right after each
//! subscription (a switch announced while nobody listened is not missed) and `PING`s it
//! every 500 ms, moving to the next Sentinel when no answer comes (a half-open connection
//! hears nothing). Before a request goes out, a view of the master that no Sentinel
//! confirmed within the last second is confirmed by asking them; when none answers, the
//! request fails instead of granting a lock on a master that may have been replaced.
//!
//! With TLS, `rediss://` sentinel URLs make the master connections TLS too, with the same
//! CA and client certificate.

mod switch;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use self::switch::SwitchWatch;
use crate::backend::redis::client::{client, password};
use crate::backend::redis::settings::{Auth, Timeouts, TlsFiles, Unconfirmed};

/// The Sentinels of one service: who the master is, and whether it switched.
pub(crate) struct Sentinel {
    /// Asks the sentinels for the master, and builds its client (credentials, TLS mode and
    /// certificates of the sentinel URLs and the builder).
    resolver: tokio::sync::Mutex<SentinelClient>,
    first: Client,
    switches: SwitchWatch,
    /// The masters' password, when it is not the sentinel URLs'.
    master_password: Option<String>,
}

impl Sentinel {
    /// Parses the sentinel URLs; nothing is contacted yet.
    pub(crate) fn new(
        sentinels: &[String],
        service: String,
        master_auth: Option<Auth>,
        tls: &TlsFiles,
        timeouts: Timeouts,
    ) -> redis::RedisResult<Sentinel> {
        let first = client(
            sentinels.first().ok_or_else(|| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "sentinel needs at least one sentinel URL",
                ))
            })?,
            tls,
        )?;
        let resolver = resolver(sentinels, &service, master_auth.as_ref(), tls)?;
        let watchers = sentinels
            .iter()
            .map(|s| client(s, tls))
            .collect::<redis::RedisResult<Vec<Client>>>()?;
        Ok(Sentinel {
            resolver: tokio::sync::Mutex::new(resolver.build()?),
            switches: SwitchWatch::new(watchers, service, timeouts),
            first,
            master_password: master_auth.map(|a| a.password),
        })
    }

    /// The master the Sentinels name now, reported to the watch before anyone connects.
    pub(crate) async fn master(&self) -> redis::RedisResult<Client> {
        let asked = tokio::time::Instant::now();
        let master = self.resolver.lock().await.async_get_client().await?;
        self.switches
            .resolved(master.get_connection_info().addr(), asked);
        Ok(master)
    }

    /// Whether a Sentinel named the current master within the last second.
    pub(crate) fn is_confirmed(&self) -> bool {
        self.switches.is_confirmed()
    }

    /// Asks the Sentinels who the master is; fails when none answers.
    pub(crate) async fn confirm(&self) -> Result<(), Unconfirmed> {
        self.switches.confirm().await
    }

    /// Master switches seen so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.switches.epoch()
    }

    /// Notified on each master switch.
    pub(crate) fn switches(&self) -> tokio::sync::watch::Receiver<u64> {
        self.switches.subscribe()
    }

    /// The passwords, to scrub from messages: the sentinel URLs' and the masters' own.
    pub(crate) fn secrets(&self) -> Vec<String> {
        password(&self.first)
            .into_iter()
            .chain(self.master_password.clone())
            .collect()
    }
}

/// The master resolver's settings, not built yet (a bad watcher URL is reported first).
fn resolver(
    sentinels: &[String],
    service: &str,
    master_auth: Option<&Auth>,
    tls: &TlsFiles,
) -> redis::RedisResult<SentinelClientBuilder> {
    let infos = sentinels
        .iter()
        .map(|s| s.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        service,
        SentinelServerType::Master,
    )?;
    let builder = credentials(builder, infos[0].redis_settings(), master_auth);
    Ok(tls_mode(builder, infos[0].addr(), tls))
}

/// The sentinels use the credentials of the first URL; the masters too, unless they have
/// their own. Both use its database.
fn credentials(
    mut builder: SentinelClientBuilder,
    settings: &RedisConnectionInfo,
    master_auth: Option<&Auth>,
) -> SentinelClientBuilder {
    if let Some(user) = settings.username() {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_sentinel_password(password);
    }
    let master = master_auth.cloned().unwrap_or_else(|| Auth {
        username: settings.username().map(str::to_owned),
        password: settings.password().unwrap_or_default().to_owned(),
    });
    if let Some(user) = &master.username {
        builder = builder.set_client_to_redis_username(user);
    }
    if !master.password.is_empty() {
        builder = builder.set_client_to_redis_password(&master.password);
    }
    builder.set_client_to_redis_db(settings.db())
}

/// Sentinels and masters both use the first URL's TLS mode, with the builder's certificates.
fn tls_mode(
    mut builder: SentinelClientBuilder,
    first: &ConnectionAddr,
    tls: &TlsFiles,
) -> SentinelClientBuilder {
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    if let ConnectionAddr::TcpTls { insecure, .. } = first {
        builder = builder.set_client_to_redis_tls_mode(if *insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        });
        #[cfg(feature = "tls")]
        if !tls.is_empty() {
            use crate::backend::redis::client::certificates;
            builder = builder
                .set_client_to_sentinel_certificates(certificates(tls))
                .set_client_to_redis_certificates(certificates(tls));
        }
    }
    builder
}
