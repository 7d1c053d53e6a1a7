//! Showing a configured URL without its secrets, for `Debug` output and log fields.
//!
//! A URL's password (`scheme://user:PASSWORD@host`) and the values of query parameters that
//! conventionally hold credentials are replaced by `<redacted>`; everything else stays, so
//! the output still says which server is meant.

/// Query (or libpq key/value) parameters whose values are credentials.
const SECRET_PARAMS: [&str; 8] = [
    "password",
    "pass",
    "api_key",
    "apikey",
    "key",
    "token",
    "access_token",
    "secret",
];

const REDACTED: &str = "<redacted>";

/// `url` with its password and credential-bearing parameters replaced by `<redacted>`.
pub(crate) fn url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => {
            // The authority ends at the first '/'; its userinfo at the last '@' before that.
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _password)) => format!("{user}:{REDACTED}@{host}"),
                    None => format!("{userinfo}@{host}"),
                },
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{path}")
        }
        // Not a URL (e.g. libpq's `host=… password=…`): redact `password=` words.
        None => head
            .split(' ')
            .map(redact_param)
            .collect::<Vec<_>>()
            .join(" "),
    };
    if let Some(query) = query {
        out.push('?');
        out.push_str(
            &query
                .split('&')
                .map(redact_param)
                .collect::<Vec<_>>()
                .join("&"),
        );
    }
    out
}

/// The credentials `url` carries (its password, the values of its credential-bearing
/// parameters), as written and percent-decoded: for scrubbing from what a server answers,
/// which may echo the request.
pub(crate) fn credentials(url: &str) -> Vec<String> {
    let (head, query) = url
        .split_once('?')
        .map_or((url, None), |(h, q)| (h, Some(q)));
    let mut found = Vec::new();
    if let Some((_scheme, rest)) = head.split_once("://") {
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        if let Some((userinfo, _host)) = authority.rsplit_once('@')
            && let Some((_user, password)) = userinfo.split_once(':')
        {
            found.push(password);
        }
    }
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        if let Some((key, value)) = pair.split_once('=')
            && SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str())
        {
            found.push(value);
        }
    }
    let mut out = Vec::new();
    for raw in found.into_iter().filter(|v| !v.is_empty()) {
        let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
        if decoded != raw {
            out.push(decoded.into_owned());
        }
        out.push(raw.to_owned());
    }
    out
}

/// A short, stable stand-in for personal data in logs (a recipient, say): the first 12 hex
/// digits of its SHA-256, enough to correlate lines about one address without showing it.
pub fn fingerprint(value: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(value.as_bytes());
    hex::encode(&digest[..6])
}

/// `text` (a provider's error message) with every word that is or shows part of a
/// credential replaced by `<redacted>`: the configured `key` itself, a word sharing its last
/// four characters, a masked key (`sk-ab**********wxyz`), or a word shaped like an API key or
/// organisation id (`sk-…`, `org-…`). Providers quote masked keys in authentication errors;
/// even a fragment narrows a guess, so none of it reaches logs or dead-letter reasons.
pub(crate) fn secrets(text: &str, key: Option<&str>) -> String {
    let key = key.map(str::trim).filter(|k| !k.is_empty());
    let text = match key {
        Some(k) => text.replace(k, REDACTED),
        None => text.to_owned(),
    };
    // A tail shorter than four characters would match ordinary words.
    let tail = key.filter(|k| k.chars().count() >= 12).map(|k| {
        k.chars()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
    });
    text.split(' ')
        .map(|word| {
            let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '*');
            let lower = bare.to_ascii_lowercase();
            let secret = bare.contains("**")
                || ["sk-", "sk_", "org-", "key-", "bearer"]
                    .iter()
                    .any(|p| lower.starts_with(p) && bare.len() > p.len())
                || tail.as_deref().is_some_and(|t| bare.contains(t));
            if secret { REDACTED } else { word }.to_owned()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn redact_param(pair: &str) -> String {
    match pair.split_once('=') {
        Some((key, _)) if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) => {
            format!("{key}={REDACTED}")
        }
        _ => pair.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{credentials, secrets, url};

    #[test]
    fn a_urls_credentials_are_its_password_and_secret_parameters() {
        assert_eq!(
            credentials("smtps://me%40x.io:p%40ss@mx:465/?tls=required"),
            ["p@ss", "p%40ss"]
        );
        assert_eq!(
            credentials("https://api.example/send?to=x&Token=t1&api_key="),
            ["t1"]
        );
        assert!(credentials("https://user@api.example/a:b@c").is_empty());
        assert!(credentials("host=db password=pw").is_empty());
    }

    #[test]
    fn no_fragment_of_a_key_survives_a_provider_message() {
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz1234";
        let openai = "Incorrect API key provided: sk-proj-********************1234. You can find \
                      your API key at https://platform.openai.com/account/api-keys.";
        let out = secrets(openai, Some(key));
        assert!(!out.contains("1234") && !out.contains("sk-proj"), "{out}");
        assert!(
            out.starts_with("Incorrect API key provided: <redacted>"),
            "{out}"
        );
        let org = secrets(
            "You must be a member of an organization: org-Xy12AbC9.",
            None,
        );
        assert!(!org.contains("Xy12AbC9"), "{org}");
        assert_eq!(
            secrets(&format!("echo {key}!"), Some(key)),
            "echo <redacted>!"
        );
        assert_eq!(
            secrets("Rate limit reached for gpt-4o", Some(key)),
            "Rate limit reached for gpt-4o"
        );
    }

    #[test]
    fn passwords_and_credential_parameters_are_hidden_and_the_host_stays() {
        assert_eq!(
            url("rediss://default:s3cr3t@cache.internal:6380/0"),
            "rediss://default:<redacted>@cache.internal:6380/0"
        );
        assert_eq!(
            url("postgres://app:p@ss@db:5432/x?sslmode=require&password=again"),
            "postgres://app:<redacted>@db:5432/x?sslmode=require&password=<redacted>"
        );
        assert_eq!(
            url("https://api.example/send?api_key=k1&to=x"),
            "https://api.example/send?api_key=<redacted>&to=x"
        );
        assert_eq!(url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            url("host=db password=pw dbname=x"),
            "host=db password=<redacted> dbname=x"
        );
    }
}
