//! Signed webhooks (the Standard Webhooks specification, <https://www.standardwebhooks.com>):
//! the target a client names, which addresses summaryd may connect to, and the secrets that
//! sign what it sends. Pure values; resolving and sending live with the sender.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use url::{Host, Url};

use super::ValidationError;
use super::email::invisible;

/// The API's name for the target, in every refusal.
const FIELD: &str = "webhook.url";

/// What a deployment relaxes in the target policy, for development and private networks.
/// Both default to off: a public summaryd must not be turned into a way to reach its own
/// network (server-side request forgery) or to send signed payloads in clear text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookRules {
    /// `http://` targets as well as `https://`.
    pub allow_http: bool,
    /// Targets on loopback, private, link-local and other non-public addresses, `localhost`
    /// and single-label host names.
    pub allow_private: bool,
}

/// A webhook target: an absolute `https` (or, when allowed, `http`) URL with a host, as the
/// `url` crate normalised it (host lower-cased and IDNA-encoded, path percent-encoded). That
/// is the crate reqwest connects with, so the host checked here is the host connected to.
///
/// Deserialising checks the syntax only ([`WebhookUrl::from_stored`]): a stored target was
/// held to the policy at intake, and is held to it again just before it is connected to
/// ([`WebhookUrl::check`], then [`check_addresses`] on what its name resolves to), under the
/// rules of that moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WebhookUrl(Url);

impl WebhookUrl {
    /// Longer targets are refused: the URL is stored with every job and outbox row, and no
    /// receiver needs more (browsers and proxies commonly stop at about 2 KB too).
    pub const MAX_LEN: usize = 2048;

    /// A target a client may give (`"webhook": {"url": …}`) or a tenant's default: at most
    /// [`Self::MAX_LEN`] characters as sent (what the OpenAPI schema's `maxLength` counts; the
    /// normalised form may be longer by its percent-encoding, a bounded growth), no
    /// invisible, control or
    /// bidirectional-format character (they make one URL read as another in a log or a
    /// console), and the policy of [`WebhookUrl::check`].
    pub fn parse(raw: &str, rules: WebhookRules) -> Result<Self, ValidationError> {
        // Bytes bound characters: only a long text needs the count.
        if raw.len() > Self::MAX_LEN && raw.chars().count() > Self::MAX_LEN {
            return Err(too_long());
        }
        if let Some((at, c)) = raw.chars().enumerate().find(|(_, c)| invisible(*c)) {
            return Err(invalid(format!(
                "contains the invisible or control character U+{:04X} at character {}",
                u32::from(c),
                at + 1
            )));
        }
        let url = Self::from_stored(raw)?;
        url.check(rules)?;
        Ok(url)
    }

    /// A stored target (stream entry, outbox row): an absolute `http` or `https` URL with a
    /// host, nothing more. The policy was applied at intake; the sender applies it again.
    pub fn from_stored(raw: &str) -> Result<Self, ValidationError> {
        let url = Url::parse(raw).map_err(|e| match e {
            url::ParseError::RelativeUrlWithoutBase => {
                invalid("must be an absolute URL (https://host/path)")
            }
            other => invalid(format!("is not a valid URL: {other}")),
        })?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(invalid("must use https"));
        }
        // http and https URLs always have one in the url crate; said for the reader.
        if url.host().is_none() {
            return Err(invalid("must name a host"));
        }
        Ok(Self(url))
    }

    /// The target policy, on a URL that parsed: `https` (or `http` with
    /// [`WebhookRules::allow_http`]); no user name or password (a secret in a URL ends up in
    /// logs, and the signature is what authenticates summaryd); no fragment (it is never
    /// sent, so it can only mislead); and, unless [`WebhookRules::allow_private`], a host
    /// that is a public IP address ([`is_public`]) or a dotted name other than `localhost`
    /// and `*.localhost`. A name is checked for its addresses when it is resolved
    /// ([`check_addresses`]); a name alone cannot say where it points.
    pub fn check(&self, rules: WebhookRules) -> Result<(), ValidationError> {
        match self.0.scheme() {
            "https" => {}
            "http" if rules.allow_http => {}
            _ => return Err(invalid("must use https")),
        }
        if !self.0.username().is_empty() || self.0.password().is_some() {
            return Err(invalid(
                "must not contain a user name or password: the signature authenticates summaryd",
            ));
        }
        if self.0.fragment().is_some() {
            return Err(invalid(
                "must not contain a fragment (#…): it is never sent to the receiver",
            ));
        }
        if rules.allow_private {
            return Ok(());
        }
        if let Some(ip) = self.ip_literal() {
            if is_public(ip) {
                return Ok(());
            }
            return Err(invalid(format!(
                "the host {ip} is not a public address (loopback, private, link-local, shared \
                 or multicast): give a public address or host name"
            )));
        }
        let name = self.host_name().unwrap_or_default();
        // `example.com.` is `example.com` written fully qualified.
        let name = name.strip_suffix('.').unwrap_or(name);
        let labels: Vec<&str> = name.split('.').collect();
        if labels.last() == Some(&"localhost") {
            return Err(invalid(
                "the host must not be localhost: it names summaryd's own machine",
            ));
        }
        if labels.len() < 2 || labels.iter().any(|l| l.is_empty()) {
            return Err(invalid(
                "the host must be a dotted name (like hooks.example.com), not a single label",
            ));
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn url(&self) -> &Url {
        &self.0
    }

    /// The host when it is an IP address (IPv6 without brackets): the address to check and
    /// connect to, with no resolution in between.
    pub fn ip_literal(&self) -> Option<IpAddr> {
        match self.0.host()? {
            Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
            Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
            Host::Domain(_) => None,
        }
    }

    /// The host when it is a DNS name (lower case, IDNA ASCII): the name to resolve.
    pub fn host_name(&self) -> Option<&str> {
        match self.0.host()? {
            Host::Domain(name) => Some(name),
            Host::Ipv4(_) | Host::Ipv6(_) => None,
        }
    }

    /// The port connected to: the URL's, or 443 for https and 80 for http.
    pub fn port(&self) -> u16 {
        self.0
            .port_or_known_default()
            .unwrap_or_else(|| unreachable!("http and https have default ports"))
    }
}

fn invalid(message: impl Into<String>) -> ValidationError {
    ValidationError::new(FIELD, message)
}

fn too_long() -> ValidationError {
    invalid(format!("longer than {} characters", WebhookUrl::MAX_LEN))
}

impl TryFrom<String> for WebhookUrl {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        // Only the message: a decoder names the field it was reading itself.
        Self::from_stored(&raw).map_err(|e| e.message)
    }
}

impl From<WebhookUrl> for String {
    fn from(url: WebhookUrl) -> Self {
        url.0.into()
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IPv4 networks that are not the public internet (IANA special-purpose registry, RFC 6890
/// and successors), as (network, prefix length).
const NON_PUBLIC_V4: [(Ipv4Addr, u32); 14] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network", unspecified
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // shared address space (carrier-grade NAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local, cloud metadata services
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation (TEST-NET-1)
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation (TEST-NET-2)
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation (TEST-NET-3)
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, and the broadcast 255.255.255.255
];

/// Global unicast: the only IPv6 space IANA allocates to networks on the internet. What lies
/// outside (unspecified, loopback, link-local fe80::/10, site-local fec0::/10, unique local
/// fc00::/7, multicast ff00::/8, discard-only 100::/64, local-use NAT64 64:ff9b:1::/48, the
/// rest of ::/8) is not public, unless it embeds an IPv4 address (see [`embedded_v4`]).
const GLOBAL_UNICAST: (Ipv6Addr, u32) = (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);

/// Networks inside global unicast that are not the public internet.
const NON_PUBLIC_V6: [(Ipv6Addr, u32); 4] = [
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32), // Teredo tunnels
    (Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48), // benchmarking
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation (RFC 9637)
];

/// NAT64's well-known prefix (RFC 6052): 64:ff9b::a.b.c.d is a.b.c.d through a translator.
const NAT64: (Ipv6Addr, u32) = (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);

/// 6to4 (RFC 3056): 2002:AABB:CCDD::/48 is the site behind the IPv4 address AA.BB.CC.DD.
const SIX_TO_FOUR: (Ipv6Addr, u32) = (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16);

/// Whether `ip` is an address on the public internet, so that connecting to it cannot reach
/// summaryd's own machine or network: not unspecified, loopback, private, link-local, shared
/// (carrier-grade NAT), multicast, broadcast, reserved, benchmarking or documentation space.
/// An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) is judged by the IPv4
/// address, which is where a connection to it ends up. Written out rather than with std's
/// `is_global`, which is not stable.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    !NON_PUBLIC_V4.iter().any(|&net| within_v4(ip, net))
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    within_v6(ip, GLOBAL_UNICAST) && !NON_PUBLIC_V6.iter().any(|&net| within_v6(ip, net))
}

/// The IPv4 address an IPv6 one stands for, if any. `::` and `::1` are IPv4-compatible
/// forms of 0.0.0.0 and 0.0.0.1, both "this network": not public either way.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4() {
        return Some(v4);
    }
    let bits = u128::from(ip);
    if within_v6(ip, NAT64) {
        return Some(Ipv4Addr::from(bits as u32));
    }
    if within_v6(ip, SIX_TO_FOUR) {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    None
}

fn within_v4(ip: Ipv4Addr, (net, len): (Ipv4Addr, u32)) -> bool {
    let mask = u32::MAX << (32 - len);
    u32::from(ip) & mask == u32::from(net)
}

fn within_v6(ip: Ipv6Addr, (net, len): (Ipv6Addr, u32)) -> bool {
    let mask = u128::MAX << (128 - len);
    u128::from(ip) & mask == u128::from(net)
}

/// A webhook host that resolved to an address summaryd must not connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "resolves to {0}, which is not a public address (loopback, private, link-local, shared or multicast)"
)]
pub struct NonPublicAddress(pub IpAddr);

/// Whether a webhook host's resolved addresses may be connected to: with
/// [`WebhookRules::allow_private`] all may; otherwise every one must be public, and the first
/// that is not refuses the whole set. A name that resolves to one public and one private
/// address is refused: whoever controls its DNS chooses which one a connection uses.
pub fn check_addresses(addrs: &[IpAddr], rules: WebhookRules) -> Result<(), NonPublicAddress> {
    if rules.allow_private {
        return Ok(());
    }
    match addrs.iter().find(|ip| !is_public(**ip)) {
        Some(&ip) => Err(NonPublicAddress(ip)),
        None => Ok(()),
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Base64 with or without its `=` padding: secrets are pasted by hand from other tools.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// One webhook signing key: `whsec_` followed by the base64 of 24 to 64 random bytes, the
/// Standard Webhooks format receivers' libraries read. Holds the decoded bytes; its `Debug`
/// never shows them, and no error echoes the text it was parsed from.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    pub const PREFIX: &str = "whsec_";
    /// Fewer bytes are too easy to guess; the specification bounds the key at both ends.
    pub const MIN_BYTES: usize = 24;
    pub const MAX_BYTES: usize = 64;
    /// Bytes in a [`WebhookSecret::generate`]d key.
    const GENERATED_BYTES: usize = 32;

    /// Parse `whsec_<base64>` (surrounding whitespace ignored, padding optional).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let encoded = raw
            .trim()
            .strip_prefix(Self::PREFIX)
            .ok_or("a webhook secret must start with whsec_")?;
        let key = LENIENT_BASE64
            .decode(encoded)
            .map_err(|_| "the part of a webhook secret after whsec_ is not standard base64")?;
        if !(Self::MIN_BYTES..=Self::MAX_BYTES).contains(&key.len()) {
            return Err(format!(
                "a webhook secret must decode to {} to {} bytes, not {}",
                Self::MIN_BYTES,
                Self::MAX_BYTES,
                key.len()
            ));
        }
        Ok(Self(key))
    }

    /// A new secret for an operator to configure: 32 bytes from the thread-local CSPRNG
    /// (seeded by the operating system), in the `whsec_` form [`WebhookSecret::parse`] reads.
    pub fn generate() -> String {
        let key: [u8; Self::GENERATED_BYTES] = rand::random();
        format!("{}{}", Self::PREFIX, STANDARD.encode(key))
    }

    /// The Standard Webhooks signature of one delivery: `v1,` and the base64 of
    /// HMAC-SHA256(key, `{msg_id}.{timestamp}.{body}`), where `msg_id` and `timestamp` (Unix
    /// seconds) are the `webhook-id` and `webhook-timestamp` headers sent with `body`.
    /// The parts are joined by bare dots, as the specification has it, so a message id must
    /// not contain one: id `m.1` with body `x` signs the same text as id `m` with body `1.x`
    /// (at the same timestamp 1).
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &str) -> String {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(format!("{msg_id}.{timestamp}.{body}").as_bytes());
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret([REDACTED])")
    }
}

/// The secrets webhooks are signed with, never empty: the first is the current one, the others
/// are kept while receivers move to it. Every delivery is signed with each, so a receiver
/// that knows either the old or the new secret accepts it throughout a rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSecrets(Vec<WebhookSecret>);

impl WebhookSecrets {
    /// The tokens file's `webhook_secrets = [...]`, current first. The error names the
    /// 1-based position of the entry at fault; an empty list is an error (nothing could be
    /// signed).
    pub fn parse_list<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let secrets = items
            .into_iter()
            .enumerate()
            .map(|(i, raw)| {
                WebhookSecret::parse(raw).map_err(|why| format!("entry {}: {why}", i + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::non_empty(secrets)
    }

    /// The file `SUMMARYD_WEBHOOK_SECRETS_FILE` names: one secret a line, current first;
    /// blank lines and lines starting with `#` are skipped. The error names the line.
    pub fn parse_file(text: &str) -> Result<Self, String> {
        let secrets = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i, line.trim()))
            .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
            .map(|(i, line)| {
                WebhookSecret::parse(line).map_err(|why| format!("line {}: {why}", i + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::non_empty(secrets)
    }

    fn non_empty(secrets: Vec<WebhookSecret>) -> Result<Self, String> {
        if secrets.is_empty() {
            return Err("lists no webhook secret: webhooks could not be signed".into());
        }
        Ok(Self(secrets))
    }

    /// The `webhook-signature` header: every secret's [`WebhookSecret::sign`], separated by
    /// single spaces, the current secret's first.
    pub fn signature_header(&self, msg_id: &str, timestamp: i64, body: &str) -> String {
        self.0
            .iter()
            .map(|secret| secret.sign(msg_id, timestamp, body))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The secret new deliveries are signed with first.
    pub fn current(&self) -> &WebhookSecret {
        &self.0[0]
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: every constructor refuses an empty set.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn iter(&self) -> impl Iterator<Item = &WebhookSecret> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: WebhookRules = WebhookRules {
        allow_http: false,
        allow_private: false,
    };
    const HTTP: WebhookRules = WebhookRules {
        allow_http: true,
        allow_private: false,
    };
    const PRIVATE: WebhookRules = WebhookRules {
        allow_http: false,
        allow_private: true,
    };

    fn refused(raw: &str, rules: WebhookRules) -> String {
        let err = WebhookUrl::parse(raw, rules).expect_err(raw);
        assert_eq!(err.field, "webhook.url", "{raw}");
        err.message
    }

    fn ip(raw: &str) -> IpAddr {
        raw.parse().unwrap()
    }

    #[test]
    fn ordinary_https_targets_are_accepted_as_normalised() {
        let url = WebhookUrl::parse("https://hooks.example.com:8443/x?y=1", STRICT).unwrap();
        assert_eq!(url.as_str(), "https://hooks.example.com:8443/x?y=1");
        assert_eq!(url.to_string(), url.as_str());
        assert_eq!(url.url().path(), "/x");
        assert_eq!(url.host_name(), Some("hooks.example.com"));
        assert_eq!(url.ip_literal(), None);
        assert_eq!(url.port(), 8443);

        let url = WebhookUrl::parse("HTTPS://Hooks.B\u{00FC}cher.Example/A%20b", STRICT).unwrap();
        assert_eq!(url.as_str(), "https://hooks.xn--bcher-kva.example/A%20b");
        assert_eq!(url.port(), 443);
        // Fully qualified names are names.
        assert!(WebhookUrl::parse("https://example.com./", STRICT).is_ok());
    }

    #[test]
    fn http_only_when_allowed() {
        let message = refused("http://example.com/", STRICT);
        assert!(message.contains("https"), "{message}");
        assert!(refused("http://example.com/", PRIVATE).contains("https"));
        let url = WebhookUrl::parse("http://example.com/", HTTP).unwrap();
        assert_eq!(url.port(), 80);
        assert!(url.check(STRICT).is_err());
        assert!(url.check(HTTP).is_ok());
        for other in [
            "ftp://example.com",
            "file:///etc/passwd",
            "ws://example.com/",
        ] {
            assert!(refused(other, HTTP).contains("https"), "{other}");
        }
    }

    #[test]
    fn what_is_not_an_absolute_url_is_refused() {
        for relative in ["/hooks", "hooks.example.com/x", "//example.com/x", ""] {
            assert!(refused(relative, STRICT).contains("absolute"), "{relative}");
            assert!(WebhookUrl::from_stored(relative).is_err(), "{relative}");
        }
        for bad in [
            "https://",
            "https://exa mple.com/",
            "https://[::1/",
            "https://1.2.3.999/",
        ] {
            assert!(WebhookUrl::parse(bad, PRIVATE).is_err(), "{bad}");
        }
        assert!(refused("https://1.2.3.999/", STRICT).contains("not a valid URL"));
    }

    #[test]
    fn credentials_and_fragments_are_refused() {
        for with_credentials in [
            "https://user:pw@example.com/",
            "https://user@example.com/",
            "https://:pw@example.com/",
        ] {
            for rules in [STRICT, PRIVATE] {
                let message = refused(with_credentials, rules);
                assert!(message.contains("user name or password"), "{message}");
            }
        }
        for with_fragment in ["https://example.com/#frag", "https://example.com/#"] {
            for rules in [STRICT, PRIVATE] {
                assert!(refused(with_fragment, rules).contains("fragment"));
            }
        }
    }

    #[test]
    fn non_public_ip_literals_are_refused_unless_private_targets_are_allowed() {
        for (raw, shown) in [
            ("https://127.0.0.1/", "127.0.0.1"),
            ("https://[::1]/", "::1"),
            ("https://[::ffff:10.0.0.1]/", "::ffff:10.0.0.1"),
            ("https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("https://10.1.2.3/", "10.1.2.3"),
            ("https://100.64.0.1/", "100.64.0.1"),
            ("https://169.254.169.254/latest", "169.254.169.254"),
            ("https://[fe80::1]/", "fe80::1"),
            ("https://[fd00::1]:8443/", "fd00::1"),
            ("https://0.0.0.0/", "0.0.0.0"),
            // The WHATWG forms of an IPv4 address are addresses.
            ("https://127.1/", "127.0.0.1"),
            ("https://0x7f000001/", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://0177.0.0.1/", "127.0.0.1"),
        ] {
            let message = refused(raw, STRICT);
            assert!(message.contains(shown), "{raw}: {message}");
            assert!(message.contains("not a public address"), "{raw}: {message}");
            let url = WebhookUrl::parse(raw, PRIVATE).expect(raw);
            assert_eq!(url.ip_literal(), Some(ip(shown)), "{raw}");
            assert_eq!(url.host_name(), None, "{raw}");
        }
    }

    #[test]
    fn public_ip_literals_are_accepted() {
        for (raw, literal) in [
            ("https://8.8.8.8/", "8.8.8.8"),
            (
                "https://[2606:4700:4700::1111]:8443/x",
                "2606:4700:4700::1111",
            ),
            ("https://[::ffff:8.8.8.8]/", "::ffff:8.8.8.8"),
        ] {
            let url = WebhookUrl::parse(raw, STRICT).expect(raw);
            assert_eq!(url.ip_literal(), Some(ip(literal)));
            assert_eq!(url.host_name(), None);
        }
    }

    #[test]
    fn localhost_and_single_labels_are_refused_unless_private_targets_are_allowed() {
        for raw in [
            "https://localhost/",
            "https://LOCALHOST:8443/",
            "https://localhost./",
            "https://a.localhost/",
            "https://b.a.localhost/",
            "https://%6cocalhost/",
            "https://\u{FF4C}\u{FF4F}\u{FF43}\u{FF41}\u{FF4C}\u{FF48}\u{FF4F}\u{FF53}\u{FF54}/",
        ] {
            assert!(refused(raw, STRICT).contains("localhost"), "{raw}");
            assert!(refused(raw, HTTP).contains("localhost"), "{raw}");
            assert!(WebhookUrl::parse(raw, PRIVATE).is_ok(), "{raw}");
        }
        for raw in ["https://intranet/", "https://intranet./", "https://a..b/"] {
            let message = refused(raw, STRICT);
            assert!(message.contains("dotted"), "{raw}: {message}");
            assert!(WebhookUrl::parse(raw, PRIVATE).is_ok(), "{raw}");
        }
        // Only the last label: a name that merely contains it is someone's domain.
        for ok in ["https://localhost.example.com/", "https://mylocalhost.com/"] {
            assert!(WebhookUrl::parse(ok, STRICT).is_ok(), "{ok}");
        }
    }

    #[test]
    fn invisible_and_control_characters_are_refused() {
        for (raw, shown) in [
            ("https://example.com/\u{202E}x", "U+202E at character 21"),
            ("https://exa\u{200B}mple.com/", "U+200B"),
            ("https://example.com/\tx", "U+0009"),
            (" https://example.com/", "U+0020 at character 1"),
            ("https://example.com/\n", "U+000A"),
            ("https://example.com/?a=\u{FEFF}", "U+FEFF"),
        ] {
            let message = refused(raw, PRIVATE);
            assert!(message.contains(shown), "{raw:?}: {message}");
        }
        // Visible non-ASCII is fine: the url crate encodes it.
        let url = WebhookUrl::parse("https://example.com/caf\u{00E9}", STRICT).unwrap();
        assert_eq!(url.as_str(), "https://example.com/caf%C3%A9");
    }

    #[test]
    fn the_limit_is_2048_characters_as_sent() {
        let prefix = "https://example.com/";
        let at_limit = format!("{prefix}{}", "a".repeat(WebhookUrl::MAX_LEN - prefix.len()));
        assert_eq!(at_limit.len(), 2048);
        assert!(WebhookUrl::parse(&at_limit, STRICT).is_ok());
        let over = format!("{at_limit}a");
        assert!(refused(&over, STRICT).contains("2048"));
        // 2048 characters, 2049 bytes as sent and 2053 once `é` is percent-encoded: the
        // schema counts characters, and what the client sent is what it can fix.
        let accented = format!(
            "{prefix}{}\u{00E9}",
            "a".repeat(WebhookUrl::MAX_LEN - prefix.len() - 1)
        );
        assert_eq!(accented.chars().count(), 2048);
        let url = WebhookUrl::parse(&accented, STRICT).unwrap();
        assert_eq!(url.as_str().len(), 2053);
        assert!(refused(&format!("{accented}a"), STRICT).contains("2048"));
        // A URL without a path gains a `/`: still accepted at the limit.
        let bare = format!(
            "https://{}.example.com",
            "a".repeat(WebhookUrl::MAX_LEN - 20)
        );
        assert_eq!(bare.len(), 2048);
        assert!(WebhookUrl::parse(&bare, STRICT).is_ok());
    }

    #[test]
    fn stored_targets_are_held_to_the_syntax_only() {
        for stored in [
            "http://localhost:8080/hook",
            "https://10.0.0.5/",
            "https://user:pw@intranet/#x",
        ] {
            let url = WebhookUrl::from_stored(stored).expect(stored);
            let json = serde_json::to_string(&url).unwrap();
            assert_eq!(json, serde_json::to_string(url.as_str()).unwrap());
            let back: WebhookUrl = serde_json::from_str(&json).unwrap();
            assert_eq!(back, url);
            assert!(url.check(STRICT).is_err(), "{stored}");
        }
        for bad in ["ftp://example.com/", "mailto:a@example.com", "not a url"] {
            assert!(WebhookUrl::from_stored(bad).is_err(), "{bad}");
            let json = serde_json::to_string(bad).unwrap();
            assert!(serde_json::from_str::<WebhookUrl>(&json).is_err(), "{bad}");
        }
        let err = serde_json::from_str::<WebhookUrl>(r#""ftp://x.example""#).unwrap_err();
        assert!(err.to_string().contains("must use https"), "{err}");
        assert_eq!(
            String::from(WebhookUrl::from_stored("https://a.example/b").unwrap()),
            "https://a.example/b"
        );
    }

    /// Every range: the addresses either side of each edge, inside and outside.
    #[test]
    fn ipv4_ranges_at_their_edges() {
        for (addr, public) in [
            ("0.0.0.0", false),
            ("0.255.255.255", false),
            ("1.0.0.0", true),
            ("9.255.255.255", true),
            ("10.0.0.0", false),
            ("10.255.255.255", false),
            ("11.0.0.0", true),
            ("100.63.255.255", true),
            ("100.64.0.0", false),
            ("100.127.255.255", false),
            ("100.128.0.0", true),
            ("126.255.255.255", true),
            ("127.0.0.0", false),
            ("127.255.255.255", false),
            ("128.0.0.0", true),
            ("169.253.255.255", true),
            ("169.254.0.0", false),
            ("169.254.255.255", false),
            ("169.255.0.0", true),
            ("172.15.255.255", true),
            ("172.16.0.0", false),
            ("172.31.255.255", false),
            ("172.32.0.0", true),
            ("191.255.255.255", true),
            ("192.0.0.0", false),
            ("192.0.0.255", false),
            ("192.0.1.0", true),
            ("192.0.1.255", true),
            ("192.0.2.0", false),
            ("192.0.2.255", false),
            ("192.0.3.0", true),
            ("192.167.255.255", true),
            ("192.168.0.0", false),
            ("192.168.255.255", false),
            ("192.169.0.0", true),
            ("198.17.255.255", true),
            ("198.18.0.0", false),
            ("198.19.255.255", false),
            ("198.20.0.0", true),
            ("198.51.99.255", true),
            ("198.51.100.0", false),
            ("198.51.100.255", false),
            ("198.51.101.0", true),
            ("203.0.112.255", true),
            ("203.0.113.0", false),
            ("203.0.113.255", false),
            ("203.0.114.0", true),
            ("223.255.255.255", true),
            ("224.0.0.0", false),
            ("239.255.255.255", false),
            ("240.0.0.0", false),
            ("255.255.255.254", false),
            ("255.255.255.255", false),
            ("8.8.8.8", true),
            ("1.1.1.1", true),
        ] {
            assert_eq!(is_public(ip(addr)), public, "{addr}");
        }
    }

    #[test]
    fn ipv6_ranges_at_their_edges() {
        for (addr, public) in [
            ("::", false),
            ("::1", false),
            ("fe80::1", false),
            ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("fec0::1", false),
            ("fc00::", false),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("ff02::1", false),
            ("100::1", false),
            ("64:ff9b:1::808:808", false),
            ("::1:0:0", false),
            // Global unicast, 2000::/3, and the special networks inside it.
            ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("2000::", true),
            ("2001::", false),
            ("2001:0:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("2001:1::", true),
            ("2001:1:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("2001:2::", false),
            ("2001:2:0:ffff:ffff:ffff:ffff:ffff", false),
            ("2001:2:1::", true),
            ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("2001:db8::", false),
            ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("2001:db9::", true),
            ("2001:4860:4860::8888", true),
            ("2606:4700:4700::1111", true),
            ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("3fff::", false),
            ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("3fff:1000::", true),
            ("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("4000::", false),
        ] {
            assert_eq!(is_public(ip(addr)), public, "{addr}");
        }
    }

    #[test]
    fn ipv6_addresses_carrying_ipv4_are_judged_by_it() {
        for (addr, public) in [
            // IPv4-mapped.
            ("::ffff:8.8.8.8", true),
            ("::ffff:127.0.0.1", false),
            ("::ffff:10.0.0.1", false),
            ("::ffff:169.254.169.254", false),
            ("::ffff:0.0.0.0", false),
            // IPv4-compatible.
            ("::8.8.8.8", true),
            ("::10.0.0.1", false),
            ("::255.255.255.255", false),
            // NAT64's well-known prefix.
            ("64:ff9b::8.8.8.8", true),
            ("64:ff9b::127.0.0.1", false),
            ("64:ff9b::a00:1", false),
            ("64:ff9b::c0a8:101", false),
            // 6to4: the IPv4 address is bits 16 to 48.
            ("2002:808:808::", true),
            ("2002:808:808:ffff:ffff:ffff:ffff:ffff", true),
            ("2002:a00:1::", false),
            ("2002:7f00:1::1", false),
            ("2002::", false),
            ("2002:ffff:ffff::", false),
            ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("2003::", true),
        ] {
            assert_eq!(is_public(ip(addr)), public, "{addr}");
        }
    }

    #[test]
    fn one_non_public_address_refuses_the_whole_set() {
        let public = [ip("8.8.8.8"), ip("2606:4700:4700::1111")];
        assert_eq!(check_addresses(&public, STRICT), Ok(()));
        let mixed = [ip("8.8.8.8"), ip("10.0.0.1"), ip("::1")];
        let err = check_addresses(&mixed, STRICT).unwrap_err();
        assert_eq!(err, NonPublicAddress(ip("10.0.0.1")));
        assert_eq!(
            err.to_string(),
            "resolves to 10.0.0.1, which is not a public address (loopback, private, \
             link-local, shared or multicast)"
        );
        assert_eq!(
            check_addresses(&[ip("::1"), ip("8.8.8.8")], HTTP),
            Err(NonPublicAddress(ip("::1")))
        );
        assert_eq!(check_addresses(&mixed, PRIVATE), Ok(()));
        assert_eq!(check_addresses(&[], STRICT), Ok(()));
    }

    #[test]
    fn rules_default_to_strict() {
        assert_eq!(WebhookRules::default(), STRICT);
    }

    /// The test vector of the Standard Webhooks reference libraries.
    #[test]
    fn signatures_match_the_reference_libraries() {
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(secret.0.len(), 24);
        let signature = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let secrets =
            WebhookSecrets::parse_list(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).unwrap();
        assert_eq!(
            secrets.signature_header(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                r#"{"test": 2432232314}"#
            ),
            signature
        );
    }

    #[test]
    fn every_input_changes_the_signature() {
        let secret = WebhookSecret::parse(&WebhookSecret::generate()).unwrap();
        let other = WebhookSecret::parse(&WebhookSecret::generate()).unwrap();
        let base = secret.sign("msg_1", 1, "{}");
        assert!(base.starts_with("v1,"), "{base}");
        assert_eq!(base, secret.sign("msg_1", 1, "{}"));
        for changed in [
            secret.sign("msg_2", 1, "{}"),
            secret.sign("msg_1", 2, "{}"),
            secret.sign("msg_1", 1, "{ }"),
            other.sign("msg_1", 1, "{}"),
        ] {
            assert_ne!(base, changed);
        }
        // The signed text is only unambiguous while ids have no dot (see `sign`).
        assert_eq!(secret.sign("msg.1", 1, "x"), secret.sign("msg", 1, "1.x"));
    }

    #[test]
    fn rotation_signs_with_every_secret_current_first() {
        let current = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let previous = WebhookSecret::generate();
        let secrets = WebhookSecrets::parse_list([current, previous.as_str()]).unwrap();
        assert_eq!(secrets.len(), 2);
        assert!(!secrets.is_empty());
        assert_eq!(secrets.current(), &WebhookSecret::parse(current).unwrap());
        assert_eq!(secrets.iter().count(), 2);
        let header = secrets.signature_header("msg_1", 1614265330, "{}");
        let signatures: Vec<&str> = header.split(' ').collect();
        assert_eq!(
            signatures,
            [
                WebhookSecret::parse(current)
                    .unwrap()
                    .sign("msg_1", 1614265330, "{}"),
                WebhookSecret::parse(&previous)
                    .unwrap()
                    .sign("msg_1", 1614265330, "{}"),
            ]
        );
    }

    #[test]
    fn generated_secrets_parse_and_differ() {
        let generated = WebhookSecret::generate();
        assert!(generated.starts_with("whsec_"), "{generated}");
        let secret = WebhookSecret::parse(&generated).unwrap();
        assert_eq!(secret.0.len(), 32);
        assert_ne!(
            secret,
            WebhookSecret::parse(&WebhookSecret::generate()).unwrap()
        );
    }

    fn whsec(bytes: usize) -> String {
        format!("whsec_{}", STANDARD.encode(vec![0x5a; bytes]))
    }

    #[test]
    fn secrets_are_24_to_64_bytes_of_prefixed_base64() {
        for ok in [whsec(24), whsec(64), format!("  {}\n", whsec(32))] {
            assert!(WebhookSecret::parse(&ok).is_ok(), "{ok}");
        }
        // Padding is optional: 25 bytes encode with `==`.
        let padded = whsec(25);
        assert!(padded.ends_with("=="), "{padded}");
        assert_eq!(
            WebhookSecret::parse(padded.trim_end_matches('=')).unwrap(),
            WebhookSecret::parse(&padded).unwrap()
        );
        for (bad, why) in [
            (whsec(23), "not 23"),
            (whsec(65), "not 65"),
            (whsec(0), "not 0"),
            (STANDARD.encode([0x5a; 32]), "must start with whsec_"),
            (format!("WHSEC_{}", STANDARD.encode([0x5a; 32])), "whsec_"),
            ("whsec_not*base64!!".into(), "not standard base64"),
            (format!("{}-_", whsec(30)), "not standard base64"),
        ] {
            let err = WebhookSecret::parse(&bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
            let tail = &bad[bad.len().min(6)..];
            assert!(tail.is_empty() || !err.contains(tail), "{err} echoes {bad}");
        }
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let raw = whsec(32);
        let secret = WebhookSecret::parse(&raw).unwrap();
        assert_eq!(format!("{secret:?}"), "WebhookSecret([REDACTED])");
        let secrets = WebhookSecrets::parse_list([raw.as_str()]).unwrap();
        let shown = format!("{secrets:?}");
        assert_eq!(shown, "WebhookSecrets([WebhookSecret([REDACTED])])");
        assert!(!shown.contains(&raw[6..]), "{shown}");
    }

    #[test]
    fn lists_name_the_entry_at_fault() {
        let err = WebhookSecrets::parse_list([whsec(32).as_str(), "whsec_short"]).unwrap_err();
        assert!(err.starts_with("entry 2: "), "{err}");
        let err = WebhookSecrets::parse_list(["nope", "whsec_short"]).unwrap_err();
        assert!(err.starts_with("entry 1: "), "{err}");
        let err = WebhookSecrets::parse_list(std::iter::empty()).unwrap_err();
        assert!(err.contains("no webhook secret"), "{err}");
    }

    #[test]
    fn files_hold_one_secret_a_line() {
        let (first, second) = (whsec(32), whsec(40));
        let text = format!("# current first\n\n  {first}  \n   # old one\n{second}\n\n");
        let secrets = WebhookSecrets::parse_file(&text).unwrap();
        assert_eq!(secrets.len(), 2);
        assert_eq!(
            secrets,
            WebhookSecrets::parse_list([first.as_str(), second.as_str()]).unwrap()
        );
        let err = WebhookSecrets::parse_file(&format!("# x\n{first}\n\nwhsec_AAAA\n")).unwrap_err();
        assert!(err.starts_with("line 4: "), "{err}");
        for empty in ["", "\n\n", "# only a comment\n   \n"] {
            let err = WebhookSecrets::parse_file(empty).unwrap_err();
            assert!(err.contains("no webhook secret"), "{empty:?}: {err}");
        }
    }
}
