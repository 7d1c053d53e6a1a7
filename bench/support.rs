//! What the benchmarks share: their parameters from the environment, the process's CPU
//! time, and removing a run's database and keys.

/// `name` from the environment, parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user + system, every thread) this process has used so far, from /proc: a
/// figure the other load on a shared machine changes much less than wall-clock rates.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports these in USER_HZ, which is 100 on x86-64 and arm64.
    Some(ticks as f64 / 100.0)
}

/// Drop the run's database and delete its Redis keys.
pub async fn clean_up(
    pg_base: &str,
    db_name: &str,
    redis_url: &str,
    key_prefix: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let (admin, conn) =
        tokio_postgres::connect(&format!("{pg_base}/postgres"), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
        ))
        .await?;
    let client = redis::Client::open(redis_url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{key_prefix}*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
    }
    Ok(())
}
