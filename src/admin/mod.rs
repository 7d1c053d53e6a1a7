//! Operator commands (`docs/reference.md`, Command line): inspect and recover what landed in
//! a dead-letter place.

pub mod dlq;
pub mod outbox;
pub mod output;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("Redis pool: {0}")]
    RedisPool(#[from] deadpool_redis::PoolError),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Replay(#[from] crate::stream::dead_letters::ReplayError),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}
