//! The pooled [`KeyStore`](oncely_core::KeyStore) of a SQL store whose every owner write is
//! written once, on a connection (`renew_in`, `checkpoint_in`, `complete_in`, `release_in`,
//! the operations `oncely-sqlx`'s transactional phases run inside the handler's transaction):
//! here each runs on a pooled connection, outside any transaction block, so its one statement
//! is a transaction of its own, and runs again while it fails in a way the database asks to be
//! retried. [`pooled_key_store!`](crate::pooled_key_store) writes that once for PostgreSQL and
//! MySQL / MariaDB; SQLite's pooled writes differ (no lease pool: one writer at a time; no
//! retries: its busy timeout waits instead; a pooled write skips the phase's savepoint check)
//! and stay its own.

/// Implements [`KeyStore`](oncely_core::KeyStore) for `$store`, from the store's own
/// operations on a connection:
///
/// - `claim`: `$claim(self, req).await` (`req` the [`ClaimRequest`](oncely_core::ClaimRequest)
///   by value): the store's claim (its transaction and commit, or its pooled claim path);
/// - `renew`: refused once the main pool is closed (renewals end with the store), else
///   `self.renew_in(&mut conn, id, token, lease)` on a connection of `self.lease_pool()` (the
///   store's pool of its own for renewals, so that a main pool that handlers' transactions hold
///   entirely cannot make a live request lose its lease);
/// - `checkpoint`, `complete`, `release`: `self.checkpoint_in(&mut conn, id, token,
///   recovery_point, lease, None)`, `self.complete_in(&mut conn, id, token, &response,
///   retention)`, `self.release_in(&mut conn, id, token)` on a connection of `self.pool()`;
/// - every one of these four run again by [`retry_while!`](crate::retry_while) with
///   `$retryable` (a `fn(&oncely_core::StoreError) -> bool`: which errors mean the database
///   rolled the statement back and asks for it again);
/// - `get`: `$get(self, id).await`.
///
/// `$store` gives those inherent methods (`pool` and `lease_pool` return `&sqlx::Pool<_>`; the
/// `*_in` take `&mut` the database's connection and return `Result<_, StoreError>`), as
/// `oncely_postgres::PostgresStore` and `oncely_mysql::MySqlStore` do. A connection that
/// cannot be had is [`StoreError::Unavailable`](oncely_core::StoreError::Unavailable)
/// ([`map_sqlx`](crate::map_sqlx)).
#[macro_export]
macro_rules! pooled_key_store {
    ($store:ty, retry_if: $retryable:expr, claim: $claim:expr, get: $get:expr $(,)?) => {
        #[$crate::__private::async_trait]
        impl $crate::__private::oncely_core::KeyStore for $store {
            async fn claim(
                &self,
                req: $crate::__private::oncely_core::ClaimRequest,
            ) -> ::core::result::Result<
                $crate::__private::oncely_core::ClaimOutcome,
                $crate::__private::oncely_core::StoreError,
            > {
                ($claim)(self, req).await
            }

            async fn renew(
                &self,
                id: &$crate::__private::oncely_core::RecordKey,
                token: $crate::__private::oncely_core::FencingToken,
                lease: ::std::time::Duration,
            ) -> ::core::result::Result<
                $crate::__private::oncely_core::UnixMillis,
                $crate::__private::oncely_core::StoreError,
            > {
                if self.pool().is_closed() {
                    // The store was closed: renewals end with it.
                    return Err($crate::map_sqlx($crate::__private::sqlx::Error::PoolClosed));
                }
                let mut conn = self
                    .lease_pool()
                    .acquire()
                    .await
                    .map_err($crate::map_sqlx)?;
                $crate::retry_while!($retryable, self.renew_in(&mut conn, id, token, lease).await)
            }

            async fn checkpoint(
                &self,
                id: &$crate::__private::oncely_core::RecordKey,
                token: $crate::__private::oncely_core::FencingToken,
                recovery_point: &str,
                lease: ::std::time::Duration,
            ) -> ::core::result::Result<(), $crate::__private::oncely_core::StoreError> {
                let mut conn = self.pool().acquire().await.map_err($crate::map_sqlx)?;
                $crate::retry_while!(
                    $retryable,
                    self.checkpoint_in(&mut conn, id, token, recovery_point, lease, None)
                        .await
                )
            }

            async fn complete(
                &self,
                id: &$crate::__private::oncely_core::RecordKey,
                token: $crate::__private::oncely_core::FencingToken,
                response: $crate::__private::oncely_core::StoredResponse,
                retention: ::std::time::Duration,
            ) -> ::core::result::Result<(), $crate::__private::oncely_core::StoreError> {
                let mut conn = self.pool().acquire().await.map_err($crate::map_sqlx)?;
                $crate::retry_while!(
                    $retryable,
                    self.complete_in(&mut conn, id, token, &response, retention)
                        .await
                )
            }

            async fn release(
                &self,
                id: &$crate::__private::oncely_core::RecordKey,
                token: $crate::__private::oncely_core::FencingToken,
            ) -> ::core::result::Result<(), $crate::__private::oncely_core::StoreError> {
                let mut conn = self.pool().acquire().await.map_err($crate::map_sqlx)?;
                $crate::retry_while!($retryable, self.release_in(&mut conn, id, token).await)
            }

            async fn get(
                &self,
                id: &$crate::__private::oncely_core::RecordKey,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::__private::oncely_core::Record>,
                $crate::__private::oncely_core::StoreError,
            > {
                ($get)(self, id).await
            }
        }
    };
}
