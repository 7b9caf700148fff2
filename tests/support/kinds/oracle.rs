//! The kinds oracle: a redis-server the locks never touch, keys under one namespace per run.
//!
//! Multi-key sections: per key a highest fence and a counter. A section's claim checks every
//! key's fence in one script and takes all or none (a stale fence on one key rejects the whole
//! write, as fenced storage would a transaction); on the read-write key it is a writer's claim,
//! so readers below it are rejected as stale.

use std::time::Duration;

use super::multi::{KeyState, RW};

/// Fences are decimal strings compared by length then bytes (no rounding by Lua's doubles).
const ABOVE: &str = "local function above(f, m) return #f > #m or (#f == #m and f > m) end\n";

/// Writers: accepted only above every fence seen (readers' too); raises the writer fence.
const WRITE: &str = r"
if not above(ARGV[1], redis.call('GET', KEYS[1]) or '0') then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('INCR', KEYS[3])
return 1
";

/// Readers: rejected (-1) below the highest writer fence, else the counter.
const READ: &str = r"
if not above(ARGV[1], redis.call('GET', KEYS[2]) or '0') then
  redis.call('INCR', KEYS[4])
  return -1
end
if above(ARGV[1], redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('INCR', KEYS[3])
return tonumber(redis.call('GET', KEYS[5]) or '0')
";

/// Permit holders: one more inside; the highest count kept.
const ENTER: &str = r"
local v = redis.call('INCR', KEYS[1])
if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end
return v
";

/// The kinds oracle: a redis-server the locks never touch, keys under one namespace per run.
pub struct Oracle {
    conn: redis::Connection,
    ns: String,
    write: redis::Script,
    read: redis::Script,
    enter: redis::Script,
}

/// What the oracle holds at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    pub counter: i64,
    pub writes_accepted: i64,
    pub writes_rejected: i64,
    pub reads_accepted: i64,
    pub reads_rejected: i64,
    pub inside: i64,
    pub inside_max: i64,
    pub permits_done: i64,
}

const STATE_KEYS: [&str; 8] = [
    "counter",
    "w_ok",
    "w_no",
    "r_ok",
    "r_no",
    "inside",
    "inside_max",
    "done",
];

impl Oracle {
    pub fn connect(url: &str, ns: &str) -> Oracle {
        // No socket timeouts, as history::Oracle: SIGSTOP/SIGCONT would fail a read.
        let conn = redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("oracle connection");
        Oracle {
            conn,
            ns: ns.to_owned(),
            write: redis::Script::new(&format!("{ABOVE}{WRITE}")),
            read: redis::Script::new(&format!("{ABOVE}{READ}")),
            enter: redis::Script::new(ENTER),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("oracle:{}:{k}", self.ns)
    }

    /// A writer's fenced claim: `true` if accepted.
    pub fn write_claim(&mut self, fence: u64) -> bool {
        let keys = ["max", "wmax", "w_ok", "w_no"].map(|k| self.key(k));
        let mut call = self.write.key(&keys);
        let n: i64 = call
            .arg(fence.to_string())
            .invoke(&mut self.conn)
            .expect("oracle write");
        n == 1
    }

    /// A reader's fenced read: the counter, `None` if the fence is stale.
    pub fn read(&mut self, fence: u64) -> Option<i64> {
        let keys = ["max", "wmax", "r_ok", "r_no", "counter"].map(|k| self.key(k));
        let mut call = self.read.key(&keys);
        let v: i64 = call
            .arg(fence.to_string())
            .invoke(&mut self.conn)
            .expect("oracle read");
        (v >= 0).then_some(v)
    }

    pub fn cmd(&mut self, cmd: &str, key: &str) -> i64 {
        let k = self.key(key);
        let v: Option<i64> = redis::cmd(cmd).arg(k).query(&mut self.conn).expect(cmd);
        v.unwrap_or(0)
    }

    pub fn get(&mut self) -> i64 {
        self.cmd("GET", "counter")
    }

    pub fn set(&mut self, v: i64) {
        let k = self.key("counter");
        let () = redis::cmd("SET")
            .arg(k)
            .arg(v)
            .query(&mut self.conn)
            .expect("SET");
    }

    /// A permit holder starts: how many are inside with it.
    pub fn enter(&mut self) -> i64 {
        let keys = ["inside", "inside_max"].map(|k| self.key(k));
        self.enter
            .key(&keys)
            .invoke(&mut self.conn)
            .expect("oracle enter")
    }

    pub fn leave(&mut self) {
        self.cmd("DECR", "inside");
    }

    pub fn state(&mut self) -> State {
        let keys = STATE_KEYS.map(|k| self.key(k));
        let v: Vec<Option<i64>> = redis::cmd("MGET")
            .arg(&keys)
            .query(&mut self.conn)
            .expect("MGET");
        let n = |i: usize| v[i].unwrap_or(0);
        State {
            counter: n(0),
            writes_accepted: n(1),
            writes_rejected: n(2),
            reads_accepted: n(3),
            reads_rejected: n(4),
            inside: n(5),
            inside_max: n(6),
            permits_done: n(7),
        }
    }
}

/// All or none: every key's fence above its highest, else each key's rejections counted and
/// `{}` returned; then each key's fence raised and its counter returned. Keys: 5 per part.
const CLAIM_ALL: &str = r"
local n = #KEYS / 5
for i = 1, n do
  if not above(ARGV[i], redis.call('GET', KEYS[5 * i - 4]) or '0') then
    for j = 1, n do redis.call('INCR', KEYS[5 * j - 1]) end
    return {}
  end
end
local out = {}
for i = 1, n do
  redis.call('SET', KEYS[5 * i - 4], ARGV[i])
  redis.call('SET', KEYS[5 * i - 3], ARGV[i])
  redis.call('INCR', KEYS[5 * i - 2])
  out[i] = tonumber(redis.call('GET', KEYS[5 * i]) or '0')
end
return out
";

impl Oracle {
    /// A part's oracle keys: highest fence, highest writer fence, accepted, rejected, counter.
    /// The read-write key's are the writers' own ([`Oracle::write_claim`]).
    fn part_keys(&self, part: &str) -> [String; 5] {
        if part == RW {
            return ["max", "wmax", "w_ok", "w_no", "counter"].map(|k| self.key(k));
        }
        let k = |s: &str| self.key(&format!("m:{part}:{s}"));
        // An exclusive key has no readers: its writer fence is its highest fence.
        [k("max"), k("max"), k("ok"), k("no"), k("counter")]
    }

    /// A multi-key section's fenced claim and reads: each key's counter, `None` if stale.
    pub fn claim_all(&mut self, parts: &[(String, u64)]) -> Option<Vec<i64>> {
        let script = redis::Script::new(&format!("{ABOVE}{CLAIM_ALL}"));
        let keys: Vec<String> = parts.iter().flat_map(|(k, _)| self.part_keys(k)).collect();
        let mut call = script.key(keys);
        for (_, fence) in parts {
            call.arg(fence.to_string());
        }
        let v: Vec<i64> = call.invoke(&mut self.conn).expect("oracle claim_all");
        (!v.is_empty()).then_some(v)
    }

    /// The write: each key's counter set to what it read plus one, at once.
    pub fn set_all(&mut self, parts: &[(String, u64)], read: &[i64]) {
        let mut cmd = redis::cmd("MSET");
        for ((k, _), v) in parts.iter().zip(read) {
            cmd.arg(&self.part_keys(k)[4]).arg(v + 1);
        }
        let () = cmd.query(&mut self.conn).expect("oracle MSET");
    }

    /// The exclusive keys' oracles (`parts` without the read-write key).
    pub fn key_states(&mut self, parts: &[&str]) -> Vec<KeyState> {
        parts
            .iter()
            .map(|&p| {
                let [_, _, ok, no, counter] = self.part_keys(p);
                let v: Vec<Option<i64>> = redis::cmd("MGET")
                    .arg(&[counter, ok, no])
                    .query(&mut self.conn)
                    .expect("MGET");
                let n = |i: usize| v[i].unwrap_or(0);
                KeyState {
                    key: p.to_owned(),
                    counter: n(0),
                    accepted: n(1),
                    rejected: n(2),
                }
            })
            .collect()
    }
}
