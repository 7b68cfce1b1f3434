//! The request path on Redis: [`KeyStore`] for [`RedisStore`], each operation one script.

use crate::decode::{self, Fields};
use crate::scripts::SCRIPTS;
use crate::store::{MAX_DURATION_MS, RedisStore, millis};
use async_trait::async_trait;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Record, RecordKey,
    StoreError, StoredResponse, UnixMillis,
};
use std::time::Duration;

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = self.key_of(&req.id);
        let args: Vec<Vec<u8>> = vec![
            self.now_arg().into_bytes(),
            req.fingerprint.version().to_string().into_bytes(),
            req.fingerprint.digest().to_vec(),
            lease_millis(req.lease)
                .min(MAX_DURATION_MS)
                .to_string()
                .into_bytes(),
            millis(req.replay_window).to_string().into_bytes(),
            millis(req.retention).to_string().into_bytes(),
            req.id.scope.as_str().as_bytes().to_vec(),
            req.id.key.as_str().as_bytes().to_vec(),
            req.request.as_ref().map(|r| r.encode()).unwrap_or_default(),
        ];
        let v = self.eval(&SCRIPTS.claim, key, args, true).await?;
        let r = decode::reply(v)?;
        match decode::reply_bytes(&r, 0) {
            Some(b"claimed") => {
                let kind = match decode::reply_bytes(&r, 3) {
                    Some(b"new") => ClaimKind::New,
                    Some(b"takeover") => ClaimKind::Takeover,
                    Some(b"after_window") => ClaimKind::AfterReplayWindow,
                    other => {
                        return Err(StoreError::Corrupt(format!(
                            "redis: unknown claim kind {other:?}"
                        )));
                    }
                };
                let recovery_point = match decode::reply_bytes(&r, 4) {
                    Some(b) => Some(String::from_utf8(b.to_vec()).map_err(|_| {
                        StoreError::Corrupt("redis: recovery point is not UTF-8".into())
                    })?),
                    None => None,
                };
                Ok(ClaimOutcome::Claimed(
                    Claim::new(
                        FencingToken(decode::reply_int(&r, 1)?),
                        decode::reply_int(&r, 2)?,
                        kind,
                    )
                    .with_recovery_point(recovery_point),
                ))
            }
            Some(b"in_flight") => Ok(ClaimOutcome::InFlight {
                lease_expires_at: decode::reply_int(&r, 1)?,
            }),
            Some(b"replay") => Ok(ClaimOutcome::Replay {
                response: decode::response(
                    decode::reply_bytes(&r, 1),
                    decode::reply_bytes(&r, 2),
                    decode::reply_bytes(&r, 3),
                    decode::reply_bytes(&r, 4),
                )?,
                completed_at: decode::reply_int(&r, 5)?,
            }),
            Some(b"mismatch") => Ok(ClaimOutcome::Mismatch),
            Some(b"needs_attention") => Ok(ClaimOutcome::NeedsAttention {
                marked_at: decode::reply_int(&r, 1)?,
                attempts: u32::try_from(decode::reply_int(&r, 2)?)
                    .map_err(|_| StoreError::Corrupt("redis: attempts out of range".into()))?,
                recovery_point: match decode::reply_bytes(&r, 3) {
                    Some(b) => Some(String::from_utf8(b.to_vec()).map_err(|_| {
                        StoreError::Corrupt("redis: recovery point is not UTF-8".into())
                    })?),
                    None => None,
                },
            }),
            Some(b"corrupt") => Err(StoreError::Corrupt(format!(
                "redis record: bad field {}",
                String::from_utf8_lossy(decode::reply_bytes(&r, 1).unwrap_or_default())
            ))),
            _ => Err(StoreError::Corrupt(format!(
                "redis: unexpected claim reply {r:?}"
            ))),
        }
    }

    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let lease = lease_millis(lease).min(MAX_DURATION_MS);
        let r = self
            .write(
                &SCRIPTS.renew,
                id,
                vec![
                    token.0.to_string().into_bytes(),
                    lease.to_string().into_bytes(),
                ],
                true,
            )
            .await?;
        decode::reply_int(&r, 1)
    }

    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease_millis(lease).min(MAX_DURATION_MS);
        self.write(
            &SCRIPTS.checkpoint,
            id,
            vec![
                token.0.to_string().into_bytes(),
                recovery_point.as_bytes().to_vec(),
                lease.to_string().into_bytes(),
            ],
            true,
        )
        .await
        .map(drop)
    }

    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let headers = response.encode_headers();
        self.write(
            &SCRIPTS.complete,
            id,
            vec![
                token.0.to_string().into_bytes(),
                response.status.to_string().into_bytes(),
                headers,
                response.body,
                if response.body_retained { b"1" } else { b"0" }.to_vec(),
                millis(retention).to_string().into_bytes(),
            ],
            true,
        )
        .await
        .map(drop)
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        // Not waited for: a release lost in a failover only keeps the key in flight until its
        // lease lapses.
        self.write(
            &SCRIPTS.release,
            id,
            vec![token.0.to_string().into_bytes()],
            false,
        )
        .await
        .map(drop)
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        let key = self.key_of(id);
        let mut conn = self.conn.clone();
        let fields: Fields = self
            .run(async move { redis::cmd("HGETALL").arg(key).query_async(&mut conn).await })
            .await?;
        decode::record(&fields, Some(id))
    }
}
