//! Removing what a test created on the shared services. Called from `Drop`, which cannot
//! await and may run inside the test's runtime, so each runs on a thread with its own.

use tokio_postgres::NoTls;

fn block_on_own_thread<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(work());
    })
    .join();
}

/// `DROP DATABASE … WITH (FORCE)` through the maintenance database at `pg_base_url`.
pub fn drop_database_blocking(pg_base_url: String, db_name: String) {
    block_on_own_thread(move || async move {
        if let Ok((client, conn)) =
            tokio_postgres::connect(&format!("{pg_base_url}/postgres"), NoTls).await
        {
            tokio::spawn(conn);
            let _ = client
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
                ))
                .await;
        }
    });
}

/// Delete every key under `prefix`.
pub fn delete_redis_prefix_blocking(redis_url: String, prefix: String) {
    block_on_own_thread(move || async move {
        if let Ok(client) = redis::Client::open(redis_url)
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}*"))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> =
                    redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
            }
        }
    });
}
