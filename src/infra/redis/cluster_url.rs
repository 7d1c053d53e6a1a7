//! `redis+cluster://[user:password@]host:port[,host:port...][/db][?params]` (and
//! `rediss+cluster://` for TLS): the seed nodes of a Redis Cluster in one URL. Each node gets
//! the URL's credentials, database and parameters, as a plain `redis://` or `rediss://` URL
//! the redis crate parses. Errors never repeat the URL (it may hold a password).

/// Which kind of deployment the URL (and `SUMMARYD_REDIS_CLUSTER`) select.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server: the URL as given.
    Single,
    /// A cluster, reached first through these node URLs.
    Cluster(Vec<String>),
}

/// Why a cluster URL was refused; the text names the setting and never the URL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClusterUrlError {
    #[error("SUMMARYD_REDIS_URL names no cluster node (expected host:port[,host:port...])")]
    NoNodes,
    #[error("SUMMARYD_REDIS_URL has an empty node in its list (a stray comma?)")]
    EmptyNode,
    #[error(
        "SUMMARYD_REDIS_CLUSTER is set but SUMMARYD_REDIS_URL lists several hosts without \
         redis+cluster:// or rediss+cluster://"
    )]
    ListWithoutClusterScheme,
}

/// Splits `url` into seed node URLs when it selects a cluster: a `+cluster` scheme, or
/// `cluster` (SUMMARYD_REDIS_CLUSTER) with a plain URL, whose one host is the seed.
pub(crate) fn target(url: &str, cluster: bool) -> Result<Target, ClusterUrlError> {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case("redis+cluster") => ("redis", rest),
        Some((s, rest)) if s.eq_ignore_ascii_case("rediss+cluster") => ("rediss", rest),
        _ if cluster => {
            // A plain URL with a host list cannot be parsed by the redis crate; say why.
            let authority = url
                .split_once("://")
                .map(|(_, r)| r.split(['/', '?']).next().unwrap_or_default())
                .unwrap_or_default();
            if host_part(authority).contains(',') {
                return Err(ClusterUrlError::ListWithoutClusterScheme);
            }
            return Ok(Target::Cluster(vec![url.to_owned()]));
        }
        _ => return Ok(Target::Single),
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(split);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if hosts.trim().is_empty() {
        return Err(ClusterUrlError::NoNodes);
    }
    hosts
        .split(',')
        .map(|host| {
            let host = host.trim();
            if host.is_empty() {
                Err(ClusterUrlError::EmptyNode)
            } else {
                Ok(format!("{scheme}://{userinfo}{host}{tail}"))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Target::Cluster)
}

/// The hosts of an authority, without the credentials (which may hold commas).
fn host_part(authority: &str) -> &str {
    authority
        .rfind('@')
        .map_or(authority, |at| &authority[at + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_become_one_url_per_node_with_the_same_credentials() {
        assert_eq!(
            target(
                "redis+cluster://u:p%40ss@a:7000,b:7001/0?protocol=resp3",
                false
            ),
            Ok(Target::Cluster(vec![
                "redis://u:p%40ss@a:7000/0?protocol=resp3".into(),
                "redis://u:p%40ss@b:7001/0?protocol=resp3".into(),
            ]))
        );
        assert_eq!(
            target("rediss+cluster://:pw@[::1]:7000", false),
            Ok(Target::Cluster(vec!["rediss://:pw@[::1]:7000".into()]))
        );
        assert_eq!(
            target("REDIS+CLUSTER://a:1, b:2", true),
            Ok(Target::Cluster(vec![
                "redis://a:1".into(),
                "redis://b:2".into()
            ]))
        );
    }

    #[test]
    fn a_plain_url_is_one_server_unless_the_cluster_setting_says_otherwise() {
        assert_eq!(target("redis://a:6379", false), Ok(Target::Single));
        assert_eq!(target("rediss://a:6380", false), Ok(Target::Single));
        assert_eq!(
            target("rediss://:pw@a:6380", true),
            Ok(Target::Cluster(vec!["rediss://:pw@a:6380".into()]))
        );
    }

    #[test]
    fn malformed_lists_are_refused_without_echoing_the_url() {
        assert_eq!(
            target("redis+cluster://:secret@", false),
            Err(ClusterUrlError::NoNodes)
        );
        assert_eq!(
            target("redis+cluster://:secret@a:1,,b:2", false),
            Err(ClusterUrlError::EmptyNode)
        );
        assert_eq!(
            target("redis://:se,cret@a:1,b:2", true),
            Err(ClusterUrlError::ListWithoutClusterScheme)
        );
        for e in [
            ClusterUrlError::NoNodes,
            ClusterUrlError::EmptyNode,
            ClusterUrlError::ListWithoutClusterScheme,
        ] {
            assert!(!e.to_string().contains("secret"));
        }
    }
}
