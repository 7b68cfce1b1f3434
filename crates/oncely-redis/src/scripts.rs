//! The Lua scripts: each store write is one script, so one round trip and one atomic step on
//! the server (Redis runs a script to completion before any other command).
//!
//! Every script touches one record (`KEYS[1]`, its hash) and that record's entries in the
//! maintenance indexes of its slot (`KEYS[2]` lease, `KEYS[3]` marked, `KEYS[4]` retention: see
//! [`RedisStore`](crate::RedisStore), "The maintenance index"), all four keys in one hash slot,
//! so it is valid on Redis Cluster. `ARGV[1]` is always "now" in epoch milliseconds from the application clock, or the
//! empty string to read the server's own `TIME` (the default; see
//! [`ClockSource`](crate::ClockSource)). A script that calls `TIME` and then writes needs
//! effects replication, the default since Redis 5 and the only mode since Redis 7.
//!
//! The hash fields are listed in the crate documentation ("How it is stored").

use redis::Script;
use std::sync::LazyLock;

/// A script and its source (for `EVAL` when a pipelined `EVALSHA` meets `NOSCRIPT`).
pub(crate) struct Lua {
    pub(crate) script: Script,
    pub(crate) code: &'static str,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Self {
            script: Script::new(code),
            code,
        }
    }
}

/// Every script of the store, one field per script.
pub(crate) struct Scripts {
    pub(crate) claim: Lua,
    pub(crate) renew: Lua,
    pub(crate) checkpoint: Lua,
    pub(crate) complete: Lua,
    pub(crate) release: Lua,
    pub(crate) reap_one: Lua,
    pub(crate) note_redrive: Lua,
    pub(crate) reindex: Lua,
    pub(crate) op_release: Lua,
    pub(crate) op_resolve: Lua,
    pub(crate) op_retry: Lua,
}

/// Compiled once per process; `Script` sends `EVALSHA` and falls back to `EVAL` (loading the
/// script) when the server does not know it, e.g. after a restart or on a promoted replica.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Lua::new(CLAIM),
    renew: Lua::new(RENEW),
    checkpoint: Lua::new(CHECKPOINT),
    complete: Lua::new(COMPLETE),
    release: Lua::new(RELEASE),
    reap_one: Lua::new(REAP_ONE),
    note_redrive: Lua::new(NOTE_REDRIVE),
    reindex: Lua::new(REINDEX),
    op_release: Lua::new(OP_RELEASE),
    op_resolve: Lua::new(OP_RESOLVE),
    op_retry: Lua::new(OP_RETRY),
});

/// Helpers shared by every script, as a literal so that `concat!` can prepend them.
macro_rules! prelude {
    () => {
        r#"
local function now_ms()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Integers as plain decimal text (Lua 5.1 would print large numbers in exponent form).
local function int(n) return string.format('%.0f', n) end
-- Redis expiry enforces retention; relative, so an application clock need not match the server's.
local function set_ttl(k, now, expires)
  local ttl = expires - now
  if ttl < 1 then ttl = 1 end
  redis.call('PEXPIRE', k, int(ttl))
end
-- The fencing check of every write: in flight, and the caller's token is the current one.
local function owned(k, token)
  local cur = redis.call('HMGET', k, 'state', 'token')
  return cur[1] == 'in_flight' and cur[2] ~= false and tonumber(cur[2]) == tonumber(token)
end
-- Keeps the end of retention at or after the end of the lease, and re-arms the TTL.
local function keep_until(k, now, lease_at)
  local expires = tonumber(redis.call('HGET', k, 'expires'))
  if expires == nil or expires < lease_at then
    expires = lease_at
    redis.call('HSET', k, 'expires', int(expires))
  end
  set_ttl(k, now, expires)
end
-- docs/DESIGN.md, "The maintenance index": an index key lives as long as its longest-kept entry.
local function keep_index(ix, now, expires)
  local ttl = expires - now
  if ttl < 1 then ttl = 1 end
  local cur = redis.call('PTTL', ix)
  if cur == -1 or (cur >= 0 and cur < ttl) then redis.call('PEXPIRE', ix, int(ttl)) end
end
-- The record's entries in its slot's indexes, from its fields as they are now (called last by
-- every script that changes a record): in flight and marked in KEYS[3] by mark time, in flight
-- otherwise in KEYS[2] by lease end, and under an application clock every record in KEYS[4] by
-- retention end. A record that no longer exists has no entries.
local function index(k, now)
  local f = redis.call('HMGET', k, 'state', 'lease', 'marked', 'expires')
  local expires = tonumber(f[4]) or now
  if f[1] == 'in_flight' and f[3] then
    redis.call('ZREM', KEYS[2], k)
    redis.call('ZADD', KEYS[3], f[3], k)
    keep_index(KEYS[3], now, expires)
  elseif f[1] == 'in_flight' and f[2] then
    redis.call('ZREM', KEYS[3], k)
    redis.call('ZADD', KEYS[2], f[2], k)
    keep_index(KEYS[2], now, expires)
  else
    redis.call('ZREM', KEYS[2], k)
    redis.call('ZREM', KEYS[3], k)
  end
  if ARGV[1] ~= '' and f[1] and f[4] then
    redis.call('ZADD', KEYS[4], f[4], k)
    keep_index(KEYS[4], now, expires)
  elseif ARGV[1] ~= '' or not f[1] then
    redis.call('ZREM', KEYS[4], k)
  end
end
"#
    };
}

/// The helpers of the operator's changes (after [`prelude`]).
macro_rules! operator_prelude {
    () => {
        r#"
-- An operator's change (docs/DESIGN.md, "Operating the server"): whether the record is the
-- version the person read (ARGV[2] token, ARGV[3] state), and its fields now.
local function same_version(k)
  local cur = redis.call('HMGET', k, 'state', 'token')
  return cur[1] ~= false and cur[1] == ARGV[3] and tonumber(cur[2]) == tonumber(ARGV[2])
end
-- A refused change: now and the record's fields, from which the caller tells why (the same
-- rule, oncely_core's check_change).
local function refused(k, now)
  return {'refused', int(now), redis.call('HGETALL', k)}
end
-- Whether an in-flight record's lease is live at now.
local function lease_live(k, now)
  local lease_at = tonumber(redis.call('HGET', k, 'lease'))
  return lease_at ~= nil and lease_at > now
end
-- The end of a change that set the record's retention end: its TTL, its index entries, and
-- the reply with the record as it is now.
local function changed(k, now, expires)
  set_ttl(k, now, expires)
  index(k, now)
  return {'ok', redis.call('HGETALL', k)}
end
-- Raises the record's fencing token by one (every operator change does).
local function bump(k)
  redis.call('HSET', k, 'token', int(tonumber(redis.call('HGET', k, 'token')) + 1))
end
"#
    };
}

/// The claim, exactly [`oncely_core::decide`] inside the server.
///
/// `ARGV`: now, fingerprint version, digest, lease ms, replay window ms, retention ms, scope,
/// key, encoded request (`''` for none). The scope and the key are not stored (the Redis key
/// names them; records of the first form kept them as fields, which a claim drops when
/// it rewrites the hash).
///
/// Returns `{'claimed', token, lease_expires_at, kind, recovery_point|nil}`,
/// `{'in_flight', lease_expires_at}`, `{'replay', status, headers, body, retained, completed_at}`,
/// `{'mismatch'}`, `{'needs_attention', marked_at, attempts, recovery_point|nil}` or
/// `{'corrupt', why}`.
pub(crate) const CLAIM: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
local now = now_ms()
local fp_v, fp = ARGV[2], ARGV[3]
local lease, window, retention = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cur = redis.call('HMGET', k, 'state', 'token', 'fp_v', 'fp', 'lease', 'completed')
local state = cur[1]
local token, kind, rp, created, req = 1, 'new', false, now, ARGV[9]
local attempts, next_attempt = false, false
if state then
  local prev_token = tonumber(cur[2])
  if prev_token == nil then return {'corrupt', 'token'} end
  token = prev_token + 1
  -- docs/DESIGN.md, "Validation skipped on one path": every path that finds a record compares fingerprints (version and digest).
  local same = (cur[3] == fp_v and cur[4] == fp)
  if state == 'released' then
    kind = 'new'
  elseif state == 'complete' then
    local completed = tonumber(cur[6])
    if completed == nil then return {'corrupt', 'completed'} end
    if now >= completed + window then
      kind = 'after_window'
    elseif same then
      local r = redis.call('HMGET', k, 'status', 'headers', 'body', 'retained')
      return {'replay', r[1], r[2], r[3], r[4], int(completed)}
    else
      return {'mismatch'}
    end
  elseif state == 'in_flight' then
    if not same then return {'mismatch'} end
    -- Marked for a person by the completer: never claimed again while it is kept.
    local mark = redis.call('HMGET', k, 'marked', 'attempts', 'rp')
    if mark[1] then return {'needs_attention', mark[1], mark[2] or '0', mark[3]} end
    local lease_at = tonumber(cur[5])
    if lease_at == nil then return {'corrupt', 'lease'} end
    if now < lease_at then return {'in_flight', int(lease_at)} end
    -- Takeover: the same request resumes, keeping its recovery point, request, claim time and
    -- the completer's attempts on it.
    kind = 'takeover'
    local prev = redis.call('HMGET', k, 'rp', 'created', 'req', 'attempts', 'next_attempt')
    rp = prev[1]
    created = tonumber(prev[2]) or now
    if prev[3] then req = prev[3] end
    attempts, next_attempt = prev[4], prev[5]
  else
    return {'corrupt', 'state'}
  end
end
local lease_at = now + lease
local expires = now + retention
if expires < lease_at then expires = lease_at end
redis.call('DEL', k)
local f = {'fp_v', fp_v, 'fp', fp, 'token', int(token),
  'state', 'in_flight', 'lease', int(lease_at), 'created', int(created), 'expires', int(expires)}
if rp then f[#f + 1] = 'rp'; f[#f + 1] = rp end
if req ~= '' then f[#f + 1] = 'req'; f[#f + 1] = req end
if attempts then f[#f + 1] = 'attempts'; f[#f + 1] = attempts end
if next_attempt then f[#f + 1] = 'next_attempt'; f[#f + 1] = next_attempt end
redis.call('HSET', k, unpack(f))
set_ttl(k, now, expires)
index(k, now)
return {'claimed', int(token), int(lease_at), kind, rp}
"#
);

/// Renew. `ARGV`: now, token, lease ms. Returns `{'ok', lease_expires_at}` or `{'fenced'}`.
pub(crate) const RENEW: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
if not owned(k, ARGV[2]) then return {'fenced'} end
local now = now_ms()
local lease_at = now + tonumber(ARGV[3])
redis.call('HSET', k, 'lease', int(lease_at))
keep_until(k, now, lease_at)
index(k, now)
return {'ok', int(lease_at)}
"#
);

/// Checkpoint. `ARGV`: now, token, recovery point, lease ms. Returns `{'ok'}` or `{'fenced'}`.
pub(crate) const CHECKPOINT: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
if not owned(k, ARGV[2]) then return {'fenced'} end
local now = now_ms()
local lease_at = now + tonumber(ARGV[4])
redis.call('HSET', k, 'rp', ARGV[3], 'lease', int(lease_at))
keep_until(k, now, lease_at)
index(k, now)
return {'ok'}
"#
);

/// Complete. `ARGV`: now, token, status, headers (JSON), body, retained (`0`/`1`), retention ms.
/// The stored request is dropped (only the completer reads it, and only from in-flight
/// records). Returns `{'ok'}` or `{'fenced'}`.
pub(crate) const COMPLETE: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
if not owned(k, ARGV[2]) then return {'fenced'} end
local now = now_ms()
local expires = now + tonumber(ARGV[7])
redis.call('HDEL', k, 'lease', 'rp', 'req')
redis.call('HSET', k, 'state', 'complete', 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5],
  'retained', ARGV[6], 'completed', int(now), 'expires', int(expires))
set_ttl(k, now, expires)
index(k, now)
return {'ok'}
"#
);

/// Release: the record becomes a tombstone that behaves as absent but keeps its token until
/// retention ends; the stored request is dropped, as on completion. `ARGV`: now, token.
/// Returns `{'ok'}` or `{'fenced'}`.
pub(crate) const RELEASE: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
if not owned(k, ARGV[2]) then return {'fenced'} end
local now = now_ms()
redis.call('HDEL', k, 'lease', 'rp', 'req')
redis.call('HSET', k, 'state', 'released')
local expires = tonumber(redis.call('HGET', k, 'expires')) or now
set_ttl(k, now, expires)
index(k, now)
return {'ok'}
"#
);

/// Deletes the record if its retention ended by "now" (checked again inside the script, so a
/// record re-claimed since the reaper looked at it is kept), with its index entries; a record
/// kept has its entries written again from its fields (so its retention entry no longer says
/// it is due), and one already gone has them removed. `ARGV`: now.
/// Returns `{'deleted', state}`, `{'kept'}` or `{'gone'}`.
pub(crate) const REAP_ONE: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
local now = now_ms()
if redis.call('EXISTS', k) == 0 then
  index(k, now)
  return {'gone'}
end
local r = redis.call('HMGET', k, 'expires', 'state')
local expires = tonumber(r[1])
if expires == nil or expires > now then
  index(k, now)
  return {'kept'}
end
redis.call('DEL', k)
index(k, now)
return {'deleted', r[2] or ''}
"#
);

/// The completer's note on an abandoned record ([`oncely_core::Maintenance::note_redrive`]): only
/// while it is in flight with the token, its lease lapsed, it is not marked and its attempt
/// count is the one the completer saw. `ARGV`: now, token, attempts seen, `attempt` or `mark`,
/// backoff ms. Returns `{'ok', attempts, next_attempt|nil, marked|nil}` or `{'fenced'}`.
pub(crate) const NOTE_REDRIVE: &str = concat!(
    prelude!(),
    r#"
local k = KEYS[1]
if not owned(k, ARGV[2]) then return {'fenced'} end
local now = now_ms()
local cur = redis.call('HMGET', k, 'lease', 'marked', 'attempts', 'next_attempt')
local lease_at = tonumber(cur[1])
local attempts = tonumber(cur[3]) or 0
if lease_at == nil or lease_at > now or cur[2] or attempts ~= tonumber(ARGV[3]) then
  return {'fenced'}
end
local next_attempt, marked = cur[4], false
if ARGV[4] == 'attempt' then
  attempts = attempts + 1
  next_attempt = int(now + tonumber(ARGV[5]))
  redis.call('HSET', k, 'attempts', int(attempts), 'next_attempt', next_attempt)
else
  marked = int(now)
  redis.call('HSET', k, 'marked', marked)
end
index(k, now)
return {'ok', int(attempts), next_attempt, marked}
"#
);

/// Writes the record's index entries from its fields as they are now, or removes them when the
/// record no longer exists: what a reader does with an entry that no longer matches its record,
/// and what the walk of the whole namespace does with every record it finds. `ARGV`: now.
/// Returns `{'ok'}`.
pub(crate) const REINDEX: &str = concat!(
    prelude!(),
    r#"
index(KEYS[1], now_ms())
return {'ok'}
"#
);

/// An operator's release ([`oncely_core::Operator::release_record`]): the record becomes a
/// released tombstone (the next claim with the key executes anew) with its token raised by one
/// (so the process still running the old claim is fenced), keeping its retention end and TTL;
/// its stored request, response and the completer's fields are dropped. Only while it is the
/// version read, in flight or complete, and (unless forced) not in flight with a live lease.
/// `ARGV`: now, token read, state read, force (`1` or `0`).
/// Returns `{'ok', fields}` (the record afterwards, as `HGETALL`) or `{'refused', now, fields}`.
pub(crate) const OP_RELEASE: &str = concat!(
    prelude!(),
    operator_prelude!(),
    r#"
local k = KEYS[1]
local now = now_ms()
if not same_version(k) then return refused(k, now) end
local state = ARGV[3]
if state == 'released' then return refused(k, now) end
if state == 'in_flight' and lease_live(k, now) and ARGV[4] ~= '1' then return refused(k, now) end
bump(k)
redis.call('HDEL', k, 'lease', 'rp', 'req', 'attempts', 'next_attempt', 'marked',
  'status', 'headers', 'body', 'retained', 'completed')
redis.call('HSET', k, 'state', 'released')
return changed(k, now, tonumber(redis.call('HGET', k, 'expires')) or now)
"#
);

/// An operator's resolution ([`oncely_core::Operator::resolve_record`]): an in-flight record is
/// completed with the response a person decided (it then replays it, as after [`COMPLETE`]),
/// kept for the retention from now, its token raised by one, its stored request, mark and
/// backoff dropped (the attempt count stays, for its history). Only while it is the version
/// read, in flight, and (unless forced) its lease lapsed. `ARGV`: now, token read, state read,
/// force, status, headers (JSON), body, retained (`0`/`1`), retention ms.
/// Returns `{'ok', fields}` or `{'refused', now, fields}`.
pub(crate) const OP_RESOLVE: &str = concat!(
    prelude!(),
    operator_prelude!(),
    r#"
local k = KEYS[1]
local now = now_ms()
if not same_version(k) or ARGV[3] ~= 'in_flight' then return refused(k, now) end
if lease_live(k, now) and ARGV[4] ~= '1' then return refused(k, now) end
bump(k)
local expires = now + tonumber(ARGV[9])
redis.call('HDEL', k, 'lease', 'rp', 'req', 'marked', 'next_attempt')
redis.call('HSET', k, 'state', 'complete', 'status', ARGV[5], 'headers', ARGV[6],
  'body', ARGV[7], 'retained', ARGV[8], 'completed', int(now), 'expires', int(expires))
return changed(k, now, expires)
"#
);

/// An operator's retry ([`oncely_core::Operator::retry_record`]): the completer's mark and
/// backoff are lifted and its attempt count set, the token raised by one; the record (its lease
/// lapsed) goes back from the marked index to the lease index, so the completer's next pass
/// lists it and re-drives it. Only while it is the version read, in flight, marked, and kept its
/// request. `ARGV`: now, token read, state read, attempts.
/// Returns `{'ok', fields}` or `{'refused', now, fields}`.
pub(crate) const OP_RETRY: &str = concat!(
    prelude!(),
    operator_prelude!(),
    r#"
local k = KEYS[1]
local now = now_ms()
if not same_version(k) or ARGV[3] ~= 'in_flight' then return refused(k, now) end
local f = redis.call('HMGET', k, 'marked', 'req')
if not f[1] or not f[2] then return refused(k, now) end
bump(k)
redis.call('HDEL', k, 'marked', 'next_attempt')
redis.call('HSET', k, 'attempts', ARGV[4])
index(k, now)
return {'ok', redis.call('HGETALL', k)}
"#
);
