//! Settings from configuration: [`LockerConfig`] (plain data, `serde::Deserialize` with the
//! `serde` feature) and [`LockerBuilder::from_env`]. Both go through
//! [`LockerBuilder::from_config`]; `from_env` parses each variable with the same duration
//! parser the `serde` feature uses (humantime: `30s`, `500ms`, `1m 30s`).

use std::fmt;
use std::time::Duration;

use crate::builder::LockerBuilder;
use crate::error::LockError;
use crate::options::Wait;

/// A [`LockerBuilder`]'s settings as data, e.g. a section of a service's configuration file.
/// Every field is optional: what is unset keeps the builder's default. With the `serde`
/// feature it implements `Deserialize`, durations written as `"30s"` or `"500ms"` and
/// `default_wait` also as `"forever"`; unknown fields are refused.
///
/// ```
/// # fn main() -> Result<(), lockrt::LockError> {
/// use std::time::Duration;
/// let mut config = lockrt::LockerConfig::default();
/// config.url = Some("redis://127.0.0.1:6379/".into());
/// config.default_ttl = Some(Duration::from_secs(10));
/// let builder = lockrt::LockerBuilder::from_config(config)?.prefix("jobs:");
/// # let _ = builder; Ok(()) }
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct LockerConfig {
    /// A server or topology URL, as [`LockerBuilder::url`] takes it.
    pub url: Option<String>,
    /// Redis Cluster seed URLs ([`LockerBuilder::cluster`]); instead of `url`.
    pub cluster: Vec<String>,
    /// Sentinel URLs ([`LockerBuilder::sentinel`]); instead of `url`, with `service`.
    pub sentinels: Vec<String>,
    /// The master's name as the Sentinels know it (with `sentinels`).
    pub service: Option<String>,
    /// The masters' user under Sentinel, when not the sentinel URLs'
    /// ([`LockerBuilder::sentinel_master_auth`]).
    pub master_username: Option<String>,
    /// The masters' password under Sentinel, when not the sentinel URLs'
    /// ([`LockerBuilder::sentinel_master_auth`]).
    pub master_password: Option<String>,
    /// [`LockerBuilder::prefix`].
    pub prefix: Option<String>,
    /// [`LockerBuilder::default_ttl`].
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub default_ttl: Option<Duration>,
    /// [`LockerBuilder::default_wait`], or `"forever"`
    /// ([`LockerBuilder::default_wait_forever`]).
    #[cfg_attr(feature = "serde", serde(deserialize_with = "de_wait"))]
    pub default_wait: Option<Wait>,
    /// [`LockerBuilder::default_max_hold`].
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_hold: Option<Duration>,
    /// [`LockerBuilder::connect_timeout`].
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub connect_timeout: Option<Duration>,
    /// [`LockerBuilder::response_timeout`].
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub response_timeout: Option<Duration>,
    /// [`LockerBuilder::safety_margin`].
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub safety_margin: Option<Duration>,
    /// [`LockerBuilder::local_handoff`].
    pub local_handoff: Option<u32>,
    /// [`LockerBuilder::sharded_pubsub`]: every locker of one Cluster must agree.
    pub sharded_pubsub: Option<bool>,
    /// [`LockerBuilder::lazy_connect`]: build while the server is unreachable.
    pub lazy_connect: Option<bool>,
    /// [`LockerBuilder::service_name`]: the name every lock of this service shows in
    /// `lockctl` and [`Locker::lock_info`](crate::Locker::lock_info).
    pub service_name: Option<String>,
}

impl fmt::Debug for LockerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |urls: &[String]| -> Vec<String> {
            urls.iter().map(|u| crate::redact::url(u)).collect()
        };
        f.debug_struct("LockerConfig")
            .field("url", &self.url.as_deref().map(crate::redact::url))
            .field("cluster", &redacted(&self.cluster))
            .field("sentinels", &redacted(&self.sentinels))
            .field("service", &self.service)
            .field("master_username", &self.master_username)
            .field(
                "master_password",
                &self.master_password.as_ref().map(|_| "***"),
            )
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .field("max_hold", &self.max_hold)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("safety_margin", &self.safety_margin)
            .field("local_handoff", &self.local_handoff)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .field("lazy_connect", &self.lazy_connect)
            .field("service_name", &self.service_name)
            .finish()
    }
}

impl LockerConfig {
    /// The environment variables [`LockerBuilder::from_env`] reads, in the order it reads them.
    pub const ENV_VARS: [&str; 15] = [
        "LOCKRT_URL",
        "REDIS_URL",
        "LOCKRT_SENTINEL_MASTER_USERNAME",
        "LOCKRT_SENTINEL_MASTER_PASSWORD",
        "LOCKRT_PREFIX",
        "LOCKRT_DEFAULT_TTL",
        "LOCKRT_DEFAULT_WAIT",
        "LOCKRT_MAX_HOLD",
        "LOCKRT_CONNECT_TIMEOUT",
        "LOCKRT_RESPONSE_TIMEOUT",
        "LOCKRT_SAFETY_MARGIN",
        "LOCKRT_LOCAL_HANDOFF",
        "LOCKRT_SHARDED_PUBSUB",
        "LOCKRT_LAZY_CONNECT",
        "LOCKRT_SERVICE_NAME",
    ];

    /// The settings named by [`ENV_VARS`](Self::ENV_VARS), read through `lookup` (a variable
    /// is unset when it returns `None` or blank text). [`LockerBuilder::from_env`] is this
    /// with the process environment.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = lockrt::LockerConfig::from_lookup(|name| match name {
    ///     "REDIS_URL" => Some("redis://127.0.0.1:6379/".into()),
    ///     "LOCKRT_DEFAULT_TTL" => Some("10s".into()),
    ///     _ => None,
    /// })
    /// .unwrap();
    /// assert_eq!(config.default_ttl, Some(Duration::from_secs(10)));
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LockError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let duration = |name: &str| -> Result<Option<Duration>, LockError> {
            get(name)
                .map(|v| parse_duration(&v).map_err(|e| invalid(name, &v, &e)))
                .transpose()
        };
        Ok(LockerConfig {
            url: get("LOCKRT_URL").or_else(|| get("REDIS_URL")),
            master_username: get("LOCKRT_SENTINEL_MASTER_USERNAME"),
            master_password: get("LOCKRT_SENTINEL_MASTER_PASSWORD"),
            prefix: get("LOCKRT_PREFIX"),
            default_ttl: duration("LOCKRT_DEFAULT_TTL")?,
            default_wait: get("LOCKRT_DEFAULT_WAIT")
                .map(|v| parse_wait(&v).map_err(|e| invalid("LOCKRT_DEFAULT_WAIT", &v, &e)))
                .transpose()?,
            max_hold: duration("LOCKRT_MAX_HOLD")?,
            connect_timeout: duration("LOCKRT_CONNECT_TIMEOUT")?,
            response_timeout: duration("LOCKRT_RESPONSE_TIMEOUT")?,
            safety_margin: duration("LOCKRT_SAFETY_MARGIN")?,
            local_handoff: get("LOCKRT_LOCAL_HANDOFF")
                .map(|v| {
                    v.trim().parse().map_err(|_| {
                        LockError::Config(format!(
                            "LOCKRT_LOCAL_HANDOFF={v:?} is not a number of local hand-offs \
                             (0 to 31; 0 turns local hand-off off)"
                        ))
                    })
                })
                .transpose()?,
            sharded_pubsub: flag("LOCKRT_SHARDED_PUBSUB", get("LOCKRT_SHARDED_PUBSUB"))?,
            lazy_connect: flag("LOCKRT_LAZY_CONNECT", get("LOCKRT_LAZY_CONNECT"))?,
            service_name: get("LOCKRT_SERVICE_NAME"),
            ..LockerConfig::default()
        })
    }
}

impl LockerBuilder {
    /// A builder with the settings of these environment variables (unset ones keep their
    /// defaults), to adjust further or [`build`](Self::build):
    ///
    /// | variable | setting | example |
    /// |---|---|---|
    /// | `LOCKRT_URL`, else `REDIS_URL` | [`url`](Self::url) | `redis://:pw@10.0.0.5:6379/` |
    /// | `LOCKRT_SENTINEL_MASTER_USERNAME`, `…_PASSWORD` | [`sentinel_master_auth`](Self::sentinel_master_auth) | `locks-app`, `s3cret` |
    /// | `LOCKRT_PREFIX` | [`prefix`](Self::prefix) | `app:lock:` |
    /// | `LOCKRT_DEFAULT_TTL` | [`default_ttl`](Self::default_ttl) | `30s` |
    /// | `LOCKRT_DEFAULT_WAIT` | [`default_wait`](Self::default_wait), or `forever` | `5s` |
    /// | `LOCKRT_MAX_HOLD` | [`default_max_hold`](Self::default_max_hold) | `10m` |
    /// | `LOCKRT_CONNECT_TIMEOUT` | [`connect_timeout`](Self::connect_timeout) | `1s` |
    /// | `LOCKRT_RESPONSE_TIMEOUT` | [`response_timeout`](Self::response_timeout) | `500ms` |
    /// | `LOCKRT_SAFETY_MARGIN` | [`safety_margin`](Self::safety_margin) | `100ms` |
    /// | `LOCKRT_LOCAL_HANDOFF` | [`local_handoff`](Self::local_handoff) | `16`, `0` |
    /// | `LOCKRT_SHARDED_PUBSUB` | [`sharded_pubsub`](Self::sharded_pubsub) | `true`, `false` |
    /// | `LOCKRT_LAZY_CONNECT` | [`lazy_connect`](Self::lazy_connect) | `true`, `false` |
    /// | `LOCKRT_SERVICE_NAME` | [`service_name`](Self::service_name) | `billing` |
    ///
    /// With neither `LOCKRT_URL` nor `REDIS_URL` set (and no `.url(..)` added),
    /// [`build`](Self::build) fails with a [`LockError::Config`] that names both variables.
    /// Durations are written as `30s`, `500ms`, `1m 30s` (humantime). A value that does not
    /// parse, or that is not valid unicode, is a [`LockError::Config`] naming the variable and
    /// the value (URLs are never echoed: they may carry a password).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::LockerBuilder::from_env()?.build().await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn from_env() -> Result<LockerBuilder, LockError> {
        for name in LockerConfig::ENV_VARS {
            if let Err(std::env::VarError::NotUnicode(_)) = std::env::var(name) {
                return Err(LockError::Config(format!("{name} is not valid unicode")));
            }
        }
        let config = LockerConfig::from_lookup(|name| std::env::var(name).ok())?;
        Ok(LockerBuilder::from_config(config)?.missing_url_hint(
            "neither LOCKRT_URL nor REDIS_URL is set (LockerBuilder::from_env reads them): \
             set one, e.g. LOCKRT_URL=redis://host:6379/",
        ))
    }

    /// A builder with these settings (unset ones keep their defaults). Fails when more than
    /// one of `url`, `cluster` and `sentinels` is given, or `sentinels` without `service`.
    pub fn from_config(config: LockerConfig) -> Result<LockerBuilder, LockError> {
        let LockerConfig {
            url,
            cluster,
            sentinels,
            service,
            master_username,
            master_password,
            prefix,
            default_ttl,
            default_wait,
            max_hold,
            connect_timeout,
            response_timeout,
            safety_margin,
            local_handoff,
            sharded_pubsub,
            lazy_connect,
            service_name,
        } = config;
        let mut b = servers(LockerBuilder::default(), url, cluster, sentinels, service)?;
        if master_username.is_some() || master_password.is_some() {
            b = b.sentinel_master_auth(
                master_username.unwrap_or_default(),
                master_password.unwrap_or_default(),
            );
        }
        if let Some(prefix) = prefix {
            b = b.prefix(prefix);
        }
        if let Some(ttl) = default_ttl {
            b = b.default_ttl(ttl);
        }
        match default_wait {
            Some(Wait::For(wait)) => b = b.default_wait(wait),
            Some(Wait::Forever) => b = b.default_wait_forever(),
            None => {}
        }
        if let Some(max_hold) = max_hold {
            b = b.default_max_hold(max_hold);
        }
        if let Some(t) = connect_timeout {
            b = b.connect_timeout(t);
        }
        if let Some(t) = response_timeout {
            b = b.response_timeout(t);
        }
        if let Some(m) = safety_margin {
            b = b.safety_margin(m);
        }
        if let Some(n) = local_handoff {
            b = b.local_handoff(n);
        }
        if let Some(on) = sharded_pubsub {
            b = b.sharded_pubsub(on);
        }
        if let Some(on) = lazy_connect {
            b = b.lazy_connect(on);
        }
        if let Some(name) = service_name {
            b = b.service_name(name);
        }
        Ok(b)
    }
}

/// The builder with the one topology the settings name: `url`, `cluster` seeds, or
/// `sentinels` with the `service` they watch.
fn servers(
    b: LockerBuilder,
    url: Option<String>,
    cluster: Vec<String>,
    sentinels: Vec<String>,
    service: Option<String>,
) -> Result<LockerBuilder, LockError> {
    let given = [url.is_some(), !cluster.is_empty(), !sentinels.is_empty()];
    if given.iter().filter(|s| **s).count() > 1 {
        return Err(LockError::Config(
            "give only one of `url`, `cluster` and `sentinels`".into(),
        ));
    }
    match (url, sentinels.is_empty(), service) {
        (_, false, None) => Err(LockError::Config(
            "`sentinels` needs `service`, the master's name".into(),
        )),
        (_, true, Some(_)) => Err(LockError::Config("`service` needs `sentinels`".into())),
        (_, false, Some(service)) => Ok(b.sentinel(sentinels, service)),
        (Some(url), true, None) => Ok(b.url(url)),
        (None, true, None) if !cluster.is_empty() => Ok(b.cluster(cluster)),
        (None, true, None) => Ok(b),
    }
}

/// `30s`, `500ms`, `1m 30s`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| e.to_string())
}

/// A duration, or `forever`.
fn parse_wait(text: &str) -> Result<Wait, String> {
    if text.trim().eq_ignore_ascii_case("forever") {
        Ok(Wait::Forever)
    } else {
        parse_duration(text)
            .map(Wait::For)
            .map_err(|e| format!("{e} (or `forever`)"))
    }
}

fn invalid(name: &str, value: &str, why: &str) -> LockError {
    LockError::Config(format!("{name}={value:?} is not a duration: {why}"))
}

#[cfg(feature = "serde")]
fn de_wait<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Wait>, D::Error> {
    use serde::Deserialize;
    Option::<String>::deserialize(d)?
        .map(|v| parse_wait(&v).map_err(serde::de::Error::custom))
        .transpose()
}

/// A `true`/`false` variable (also `1`/`0`, `on`/`off`), its name in the error.
fn flag(name: &str, value: Option<String>) -> Result<Option<bool>, LockError> {
    value
        .map(|v| match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "on" => Ok(true),
            "false" | "0" | "off" => Ok(false),
            _ => Err(LockError::Config(format!(
                "{name}={v:?} is not `true` or `false`"
            ))),
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn every_variable_is_read() {
        let c = LockerConfig::from_lookup(lookup(&[
            ("LOCKRT_URL", "redis://a:6379/"),
            ("REDIS_URL", "redis://b:6379/"),
            ("LOCKRT_PREFIX", "app:"),
            ("LOCKRT_DEFAULT_TTL", "30s"),
            ("LOCKRT_DEFAULT_WAIT", "forever"),
            ("LOCKRT_MAX_HOLD", "10m"),
            ("LOCKRT_CONNECT_TIMEOUT", "1s 500ms"),
            ("LOCKRT_RESPONSE_TIMEOUT", "500ms"),
            ("LOCKRT_SAFETY_MARGIN", " 200ms "),
            ("LOCKRT_LOCAL_HANDOFF", " 4 "),
            ("LOCKRT_SHARDED_PUBSUB", "False"),
            ("LOCKRT_LAZY_CONNECT", "on"),
        ]))
        .unwrap();
        assert_eq!(c.url.as_deref(), Some("redis://a:6379/"));
        assert_eq!(c.prefix.as_deref(), Some("app:"));
        assert_eq!(c.default_ttl, Some(Duration::from_secs(30)));
        assert_eq!(c.default_wait, Some(Wait::Forever));
        assert_eq!(c.max_hold, Some(Duration::from_secs(600)));
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(c.response_timeout, Some(Duration::from_millis(500)));
        assert_eq!(c.safety_margin, Some(Duration::from_millis(200)));
        assert_eq!(c.local_handoff, Some(4));
        assert_eq!(c.sharded_pubsub, Some(false));
        assert_eq!(c.lazy_connect, Some(true));
    }

    #[test]
    fn redis_url_is_the_fallback_and_blank_is_unset() {
        let c = LockerConfig::from_lookup(lookup(&[
            ("LOCKRT_URL", "  "),
            ("REDIS_URL", "redis://b:6379/"),
            ("LOCKRT_DEFAULT_WAIT", "250ms"),
        ]))
        .unwrap();
        assert_eq!(c.url.as_deref(), Some("redis://b:6379/"));
        assert_eq!(c.default_wait, Some(Wait::For(Duration::from_millis(250))));
        assert_eq!(
            LockerConfig::from_lookup(lookup(&[])).unwrap(),
            LockerConfig::default()
        );
    }

    #[test]
    fn invalid_values_name_the_variable_and_value() {
        for (name, value) in [
            ("LOCKRT_DEFAULT_TTL", "30"),
            ("LOCKRT_DEFAULT_WAIT", "never"),
            ("LOCKRT_MAX_HOLD", "-1s"),
            ("LOCKRT_CONNECT_TIMEOUT", "1 fortnight"),
            ("LOCKRT_RESPONSE_TIMEOUT", "fast"),
            ("LOCKRT_SAFETY_MARGIN", "100 ms!"),
            ("LOCKRT_LOCAL_HANDOFF", "sixteen"),
            ("LOCKRT_SHARDED_PUBSUB", "maybe"),
            ("LOCKRT_LAZY_CONNECT", "yes please"),
        ] {
            let err = LockerConfig::from_lookup(lookup(&[
                ("LOCKRT_URL", "redis://:hunter2@a:6379/"),
                (name, value),
            ]))
            .unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, LockError::Config(_)), "{text}");
            assert!(text.contains(name), "{text}");
            assert!(text.contains(value), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn from_config_sets_the_builder_and_refuses_two_topologies() {
        let mut c = LockerConfig {
            prefix: Some("x:".into()),
            default_ttl: Some(Duration::from_secs(5)),
            default_wait: Some(Wait::Forever),
            ..LockerConfig::default()
        };
        let b = LockerBuilder::from_config(c.clone()).unwrap();
        let shown = format!("{b:?}");
        assert!(shown.contains("\"x:\"") && shown.contains("5s") && shown.contains("Forever"));

        c.url = Some("redis://a:6379/".into());
        c.cluster = vec!["redis://b:7000/".into()];
        assert!(matches!(
            LockerBuilder::from_config(c),
            Err(LockError::Config(_))
        ));
        let c = LockerConfig {
            sentinels: vec!["redis://s:26379/".into()],
            ..LockerConfig::default()
        };
        assert!(LockerBuilder::from_config(c).is_err());
    }

    #[test]
    fn debug_hides_passwords() {
        let c = LockerConfig {
            url: Some("redis://:hunter2@a:6379/".into()),
            cluster: vec!["redis://u:hunter2@b:7000/".into()],
            ..LockerConfig::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
