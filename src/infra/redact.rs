//! Showing a configured URL without its secrets, for `Debug` output and log fields.
//!
//! A URL's password (`scheme://user:PASSWORD@host`), the values of query parameters that
//! conventionally hold credentials, and the same keywords in a libpq key/value string
//! (`host=db password='a b'`) are replaced by `<redacted>`; everything else stays, so the
//! output still says which server is meant.
//!
//! The URL is taken apart here rather than by the `url` crate: a WHATWG parser ends the
//! authority at the first `/`, `?` or `#`, but real configured URLs carry passwords with
//! those characters unescaped (`redis://:pa/ss@cache`), and the parser would put the rest of
//! such a password in the path or query, where it would be shown. What is redacted is
//! decided by where a password *can* end, not by what a strict parser accepts.

use std::ops::Range;

/// Query (or libpq key/value) parameters whose values are credentials.
const SECRET_PARAMS: [&str; 9] = [
    "password",
    "pass",
    "sslpassword",
    "api_key",
    "apikey",
    "key",
    "token",
    "access_token",
    "secret",
];

const REDACTED: &str = "<redacted>";

/// One credential in a connection string: where it is written, and its value as the server
/// receives it (percent-decoded, or unquoted and unescaped).
#[derive(Debug, PartialEq, Eq)]
struct Secret {
    span: Range<usize>,
    value: String,
}

/// `url` with its password and credential-bearing parameters replaced by `<redacted>`.
pub(crate) fn url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut from = 0;
    for secret in find_secrets(url) {
        out.push_str(&url[from..secret.span.start]);
        out.push_str(REDACTED);
        from = secret.span.end;
    }
    out.push_str(&url[from..]);
    out
}

/// The credentials `url` carries (its password, the values of its credential-bearing
/// parameters), as written and as the server receives them: for scrubbing from what a
/// server answers, which may echo the request.
pub(crate) fn credentials(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for secret in find_secrets(url) {
        let raw = &url[secret.span];
        if secret.value != raw {
            out.push(secret.value);
        }
        out.push(raw.to_owned());
    }
    out
}

/// The non-empty secrets of a URL or a libpq key/value string, in order, not overlapping.
fn find_secrets(text: &str) -> Vec<Secret> {
    let found = match scheme_end(text) {
        Some(rest) => url_secrets(text, rest),
        None => keyword_secrets(text),
    };
    found.into_iter().filter(|s| !s.span.is_empty()).collect()
}

/// Where the part after `scheme://` starts, if `text` begins with a URL scheme.
fn scheme_end(text: &str) -> Option<usize> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme.len() + "://".len())
}

/// The password and the credential parameters of `text[rest..]`, the part after `scheme://`.
fn url_secrets(text: &str, rest: usize) -> Vec<Secret> {
    let (authority_end, password) = split_authority(&text[rest..]);
    let mut found: Vec<Secret> = password
        .into_iter()
        .map(|span| {
            let span = rest + span.start..rest + span.end;
            let value = percent_decoded(&text[span.clone()]);
            Secret { span, value }
        })
        .collect();
    // After the authority: path, then `?query`, then `#fragment` (which may itself hold a
    // token, as OAuth's implicit grant puts it there).
    let tail = rest + authority_end;
    let fragment = text[tail..].find('#').map_or(text.len(), |i| tail + i);
    if let Some(q) = text[tail..fragment].find('?') {
        found.extend(param_secrets(text, tail + q + 1..fragment));
    }
    if fragment < text.len() {
        found.extend(param_secrets(text, fragment + 1..text.len()));
    }
    found
}

/// Split what follows `scheme://` into the authority's length and its password's span.
///
/// The userinfo ends at the *last* `@` that can end it, so a password may hold `@`, `/`,
/// `?`, `#` and `:` unescaped. An `@` can end the userinfo only if the user name before it
/// (up to the first `:`) has no `/`, `?`, `#`, `[` or `]`: a user name never holds them
/// unescaped, so they put the `@` in a path or query (`https://api.example/send?to=bob@x`)
/// or after an IPv6 host (`https://[::1]/?to=bob@x`). Where a password and an `@` later in
/// the path cannot be told apart (`https://h:8443/send?to=bob@x`), more is hidden rather
/// than less.
fn split_authority(rest: &str) -> (usize, Option<Range<usize>>) {
    let path_start = |from: usize| {
        rest[from..]
            .find(['/', '?', '#'])
            .map_or(rest.len(), |i| from + i)
    };
    for (at, _) in rest.match_indices('@').rev() {
        let userinfo = &rest[..at];
        let (user, has_password) = match userinfo.split_once(':') {
            Some((user, _)) => (user, true),
            None => (userinfo, false),
        };
        if user.contains(['/', '?', '#', '[', ']']) {
            continue;
        }
        let password = has_password.then(|| user.len() + 1..at);
        // The host runs from the '@' (itself no delimiter) to the first delimiter after it.
        return (path_start(at), password);
    }
    (path_start(0), None)
}

/// The credential parameters among `key=value` pairs separated by `&` (or `;`) in `range`.
fn param_secrets(text: &str, range: Range<usize>) -> Vec<Secret> {
    let mut found = Vec::new();
    let mut start = range.start;
    for pair in text[range.clone()].split(['&', ';']) {
        if let Some((key, value)) = pair.split_once('=')
            && is_secret_key(&percent_decoded(key).replace('+', " "))
        {
            let value_start = start + key.len() + 1;
            found.push(Secret {
                span: value_start..value_start + value.len(),
                value: percent_decoded(&value.replace('+', " ")),
            });
        }
        start += pair.len() + 1;
    }
    found
}

/// The credential values of a libpq key/value string (`host=db password = 'a b' user=x`):
/// words separated by spaces, `=` with optional spaces around it, values single-quoted
/// (with `\'` and `\\` escapes) or running to the next space (with `\` escapes). A quote
/// left open runs to the end, so a malformed string hides more, not less.
fn keyword_secrets(text: &str) -> Vec<Secret> {
    let mut found = Vec::new();
    let mut chars = text.char_indices().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_spaces(&mut chars);
        let Some(&(key_start, _)) = chars.peek() else {
            break;
        };
        let mut key_end = text.len();
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() || c == '=' {
                key_end = i;
                break;
            }
            chars.next();
        }
        skip_spaces(&mut chars);
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            // A word without a value: nothing to hide in it.
            continue;
        }
        skip_spaces(&mut chars);
        let Some(&(value_start, first)) = chars.peek() else {
            break;
        };
        let quoted = first == '\'';
        if quoted {
            chars.next();
        }
        let mut value = String::new();
        let mut value_end = text.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '\'' if quoted => {
                    value_end = i + c.len_utf8();
                    break;
                }
                c if c.is_whitespace() && !quoted => {
                    value_end = i;
                    break;
                }
                c => value.push(c),
            }
        }
        if is_secret_key(&text[key_start..key_end]) {
            found.push(Secret {
                span: value_start..value_end,
                value,
            });
        }
    }
    found
}

fn is_secret_key(key: &str) -> bool {
    SECRET_PARAMS.contains(&key.trim().to_ascii_lowercase().as_str())
}

fn percent_decoded(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

/// What a recipient's address becomes in a provider's error text.
pub(crate) const RECIPIENT: &str = "<recipient>";

/// `text` (a provider's error message) with the recipient `address` replaced by
/// `<recipient>`: SMTP servers echo it in rejections (`550 5.1.1 <bob@acme.com>: Recipient
/// address rejected`) and mail APIs in error bodies, and logs and `outbox.last_error` are
/// no place for it. Matched without regard to ASCII case, in its `<…>` form, and its local
/// part alone where it stands as a word of its own (`unknown user bob`).
pub(crate) fn recipient(text: &str, address: &str) -> String {
    let address = address.trim();
    let Some(local) = address.rsplit_once('@').map(|(local, _)| local) else {
        return replace_ignoring_case(text, address, false);
    };
    let text = replace_ignoring_case(text, &format!("<{address}>"), false);
    let text = replace_ignoring_case(&text, address, false);
    replace_ignoring_case(&text, local, true)
}

/// `text` with every occurrence of `needle` (ASCII case ignored) replaced by `<recipient>`;
/// with `whole_word`, only where no address character touches it on either side.
fn replace_ignoring_case(text: &str, needle: &str, whole_word: bool) -> String {
    if needle.is_empty() {
        return text.to_owned();
    }
    let (haystack, needle) = (text.as_bytes(), needle.as_bytes());
    // Characters that continue a local part: a match next to one is part of another word.
    let word =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'%' | b'+' | b'-') || b >= 0x80;
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut at) = (0, 0);
    while at + needle.len() <= haystack.len() {
        let end = at + needle.len();
        let alone = !whole_word
            || ((at == 0 || !word(haystack[at - 1]))
                && (end == haystack.len() || !word(haystack[end])));
        // Byte-wise, so a match starts and ends where `needle`'s characters do: on
        // character boundaries of `text`.
        if alone && haystack[at..end].eq_ignore_ascii_case(needle) {
            out.push_str(&text[copied..at]);
            out.push_str(RECIPIENT);
            copied = end;
            at = end;
        } else {
            at += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{credentials, recipient, secrets, url};

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
        assert_eq!(credentials("host=db password='p w'"), ["p w", "'p w'"]);
        assert_eq!(credentials("redis://:pa/ss@cache:6379/0"), ["pa/ss"]);
        assert!(credentials("redis://:@cache?password=").is_empty());
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
    fn key_fragments_need_a_long_enough_key_and_a_prefix_with_more_after_it() {
        // A 12-character key is long enough for its tail to be matched; 11 is not.
        assert_eq!(
            secrets("masked as ****1234.", Some("abcdefgh1234")),
            "masked as <redacted>"
        );
        assert_eq!(
            secrets("room 1234 booked", Some("abcdefgh1234")),
            "room <redacted> booked"
        );
        assert_eq!(
            secrets("room 1234 booked", Some("abcdefg1234")),
            "room 1234 booked"
        );
        assert_eq!(secrets("room 1234", Some("  ")), "room 1234");
        // A bare prefix, a single star or a prefix inside a word is no key.
        assert_eq!(secrets("sk- org- a*b task-1", None), "sk- org- a*b task-1");
        assert_eq!(secrets("(sk-x) Bearer", None), "<redacted> Bearer");
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

    #[test]
    fn passwords_with_url_delimiters_are_hidden_whole() {
        for (raw, shown) in [
            ("redis://:pa/ss@host", "redis://:<redacted>@host"),
            ("postgres://u:p?w@h/db", "postgres://u:<redacted>@h/db"),
            ("redis://u:a#b@h:1/0", "redis://u:<redacted>@h:1/0"),
            ("redis://u:a@b/c@h/0?x=1", "redis://u:<redacted>@h/0?x=1"),
            (
                "smtp://me@x.io:p:w@mx:25",
                "smtp://me@x.io:<redacted>@mx:25",
            ),
            ("redis://:@h", "redis://:@h"),
            ("redis://u@h/0", "redis://u@h/0"),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
    }

    #[test]
    fn an_at_sign_in_a_path_or_query_is_not_a_userinfo() {
        for plain in [
            "https://api.example/send?to=bob@x",
            "https://user@api.example/a:b@c",
            "https://api.example#to=a@b",
            "https://api.example?to=a@b",
        ] {
            assert_eq!(url(plain), plain);
        }
        assert_eq!(
            url("https://api.example/send?api_key=k1&to=bob@x"),
            "https://api.example/send?api_key=<redacted>&to=bob@x"
        );
        assert_eq!(
            url("https://api.example/cb#access_token=t1&x=2"),
            "https://api.example/cb#access_token=<redacted>&x=2"
        );
        assert_eq!(
            url("https://api.example/x?a=1;Pass%77ord=pw;b=2"),
            "https://api.example/x?a=1;Pass%77ord=<redacted>;b=2"
        );
    }

    #[test]
    fn libpq_values_are_hidden_quoted_spaced_or_escaped() {
        for (raw, shown) in [
            (
                "host=db password='a b' dbname=x",
                "host=db password=<redacted> dbname=x",
            ),
            (
                "host=db password = x user=u",
                "host=db password = <redacted> user=u",
            ),
            (r"password='it\'s' host=db", "password=<redacted> host=db"),
            (r"PASSWORD=a\ b host=db", "PASSWORD=<redacted> host=db"),
            ("host=db password='open", "host=db password=<redacted>"),
            // A quote inside an unquoted value is part of it.
            ("password=ab'cd host=db", "password=<redacted> host=db"),
            ("host=db password=", "host=db password="),
            (
                "host=db sslmode password=x",
                "host=db sslmode password=<redacted>",
            ),
            (
                "  host=db\tpassword=x  ",
                "  host=db\tpassword=<redacted>  ",
            ),
            (
                "host=b\u{e9}b\u{e9} password=\u{e9}",
                "host=b\u{e9}b\u{e9} password=<redacted>",
            ),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
        assert_eq!(credentials(r"password='it\'s'"), ["it's", r"'it\'s'"]);
        assert_eq!(credentials(r"password=a\ b"), ["a b", r"a\ b"]);
        assert!(credentials("host=db user=pw").is_empty());
    }

    #[test]
    fn only_a_real_scheme_makes_a_url() {
        // `=` before `://`: a libpq value that happens to hold a URL.
        assert_eq!(
            url("password=a://b@c host=db"),
            "password=<redacted> host=db"
        );
        assert_eq!(url("1x://u:pw@h"), "1x://u:pw@h");
        assert_eq!(url("://u:pw@h"), "://u:pw@h");
        assert_eq!(url("s+s-s.1://u:pw@h"), "s+s-s.1://u:<redacted>@h");
    }

    #[test]
    fn a_recipient_echoed_by_a_server_is_replaced_in_every_spelling() {
        let to = "Bob.Smith@Acme.com";
        for (said, shown) in [
            (
                "550 5.1.1 <bob.smith@acme.COM>: Recipient address rejected",
                "550 5.1.1 <recipient>: Recipient address rejected",
            ),
            (
                "550 unknown user BOB.SMITH; bob.smith@acme.com bounced",
                "550 unknown user <recipient>; <recipient> bounced",
            ),
            ("no mailbox bob.smith.", "no mailbox <recipient>."),
            (
                "bob.smithy and xbob.smith and bob.smith-2 stay",
                "bob.smithy and xbob.smith and bob.smith-2 stay",
            ),
            ("<Bob.Smith>", "<<recipient>>"),
            // The whole address goes wherever it stands; its local part only as a word.
            ("xbob.smith@acme.comy", "x<recipient>y"),
            ("\u{100}bob.smith \u{100}", "\u{100}bob.smith \u{100}"),
            (
                "bob.smith_1 bob.smith%x +bob.smith",
                "bob.smith_1 bob.smith%x +bob.smith",
            ),
            ("b\u{f6}b bob.smith", "b\u{f6}b <recipient>"),
            ("", ""),
        ] {
            assert_eq!(recipient(said, to), shown, "{said}");
        }
        assert_eq!(recipient("say bob", "bob"), "say <recipient>");
        assert_eq!(recipient("a@b is a", "@b"), "a<recipient> is a");
        assert_eq!(recipient("keep all", " "), "keep all");
        assert_eq!(
            recipient("caf\u{e9}@x.io: no", "CAF\u{e9}@X.IO"),
            "<recipient>: no"
        );
    }

    /// Characters a password may hold in a configured URL's userinfo, unescaped or not.
    const USERINFO_PASSWORD: &str = "[A-Za-z0-9/?@#: '\"%!$&()*+,;=~-]{1,16}";
    /// In a query a password cannot hold `&`, `;` or `#` unescaped (the server would split
    /// there too), but may hold percent-encodings.
    const QUERY_PASSWORD: &str = "([A-Za-z0-9/?@: '\"!$()*+,=~-]|%[0-9A-F]{2}){1,16}";
    const HOSTS: [&str; 4] = ["cache.internal", "db-1.example", "10.0.0.7", "[::1]"];

    proptest! {
        #[test]
        fn no_userinfo_password_survives_and_the_host_stays(
            secret in USERINFO_PASSWORD,
            host in prop::sample::select(&HOSTS[..]),
            scheme in prop::sample::select(&["redis", "rediss", "postgres", "smtp", "https"][..]),
            tail in prop::sample::select(&["", "/0", ":6379/0?sslmode=require", "/db?x=1#f"][..]),
        ) {
            // A marker no host or scheme holds, so "contains" cannot match by accident.
            let password = format!("Q{secret}Q");
            let raw = format!("{scheme}://user:{password}@{host}{tail}");
            let out = url(&raw);
            prop_assert!(!out.contains(&password), "{raw} -> {out}");
            prop_assert!(out.contains(&format!("@{host}{tail}")), "{raw} -> {out}");
            prop_assert!(credentials(&raw).contains(&password), "{raw}");
        }

        #[test]
        fn no_query_password_survives_and_the_host_stays(
            secret in QUERY_PASSWORD,
            host in prop::sample::select(&HOSTS[..]),
            key in prop::sample::select(&["password", "api_key", "Token", "access_token"][..]),
        ) {
            let password = format!("Q{secret}Q");
            let raw = format!("https://{host}/send?to=x&{key}={password}&y=1");
            let out = url(&raw);
            prop_assert!(!out.contains(&password), "{raw} -> {out}");
            prop_assert!(out.starts_with(&format!("https://{host}/send?to=x&")), "{raw} -> {out}");
            prop_assert!(out.ends_with("&y=1"), "{raw} -> {out}");
        }

        #[test]
        fn no_libpq_password_survives_and_the_host_stays(
            secret in "[A-Za-z0-9 '\\\"=@/?#:%]{1,16}",
            host in prop::sample::select(&HOSTS[..]),
            spaced in any::<bool>(),
        ) {
            let password = format!("Q{secret}Q");
            let quoted = format!("'{}'", password.replace('\\', "\\\\").replace('\'', "\\'"));
            let eq = if spaced { " = " } else { "=" };
            let raw = format!("host={host} password{eq}{quoted} dbname=x");
            let out = url(&raw);
            prop_assert!(!out.contains(&password), "{raw} -> {out}");
            prop_assert!(!out.contains(&quoted), "{raw} -> {out}");
            prop_assert_eq!(out, format!("host={host} password{eq}<redacted> dbname=x"));
            prop_assert!(credentials(&raw).contains(&password), "{raw}");
        }
    }
}
