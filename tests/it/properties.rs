//! Property tests of the parsers every request goes through (key, tenant, email) and of
//! the body fingerprint that decides "same request" for idempotency.

use lettre::message::Mailbox;
use proptest::prelude::*;
use summaryd::api::body::parse_summary_request;
use summaryd::domain::WebhookRules;
use summaryd::domain::{Email, IdempotencyKey, TenantId};

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The same JSON string written with every non-ASCII character as a `\uXXXX` escape
/// (surrogate pairs beyond the BMP): a different byte sequence for the same value.
fn ascii_escaped(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// `{"text": …, "notify": …}` in either field order with `ws` around every token.
fn body(text: &str, notify: &str, notify_first: bool, ws: &[String; 8], escape: bool) -> String {
    let enc = |s: &str| {
        if escape {
            ascii_escaped(s)
        } else {
            json_string(s)
        }
    };
    let field =
        |name: &str, value: &str, a: &str, b: &str| format!("\"{name}\"{a}:{b}{}", enc(value));
    let t = field("text", text, &ws[1], &ws[2]);
    let n = field("notify", notify, &ws[3], &ws[4]);
    let (first, second) = if notify_first { (n, t) } else { (t, n) };
    format!("{{{}{first}{},{}{second}{}}}", ws[0], ws[5], ws[6], ws[7])
}

fn whitespace() -> impl Strategy<Value = [String; 8]> {
    proptest::array::uniform8("[ \t\r\n]{0,3}")
}

/// Addresses of ordinary shape: dotted atoms, plus tags, subdomains.
fn address() -> impl Strategy<Value = String> {
    (
        "[a-z0-9]{1,12}(\\.[a-z0-9]{1,8})?(\\+[a-z0-9]{1,6})?",
        "[a-z0-9]{1,12}(-[a-z0-9]{1,6})?(\\.[a-z0-9]{1,10}){0,2}",
        "(com|org|de|io|co\\.uk)",
    )
        .prop_map(|(local, domain, tld)| format!("{local}@{domain}.{tld}"))
}

/// Text the API accepts: not blank (the model needs something to summarise).
fn text() -> impl Strategy<Value = String> {
    "\\PC{1,80}".prop_filter("not blank", |t| !t.trim().is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_key_is_accepted_exactly_when_it_is_16_to_128_visible_ascii_characters(raw in "\\PC{0,140}|[!-~]{10,140}") {
        let expected = (16..=128).contains(&raw.len()) && raw.bytes().all(|b| b.is_ascii_graphic());
        match IdempotencyKey::parse(&raw) {
            Ok(key) => {
                prop_assert!(expected, "accepted {raw:?}");
                prop_assert_eq!(key.as_str(), raw.as_str());
            }
            Err(e) => {
                prop_assert!(!expected, "refused {raw:?}");
                prop_assert_eq!(e.field, "Idempotency-Key");
            }
        }
    }

    #[test]
    fn a_tenant_is_accepted_exactly_when_it_is_1_to_64_safe_characters(raw in "\\PC{0,70}|[A-Za-z0-9._:-]{0,70}") {
        let expected = (1..=64).contains(&raw.len())
            && raw.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        match TenantId::parse(&raw) {
            Ok(t) => {
                prop_assert!(expected, "accepted {raw:?}");
                prop_assert_eq!(t.as_str(), raw.as_str());
                // Safe inside a Redis key: no separator, no space.
                prop_assert!(!raw.contains(':') && !raw.contains(' '));
            }
            Err(_) => prop_assert!(!expected, "refused {raw:?}"),
        }
    }

    #[test]
    fn every_accepted_email_is_one_the_smtp_provider_parses_to_the_same_address(raw in "\\PC{0,40}|[a-z0-9.+@\"()<> -]{0,40}") {
        if let Ok(email) = Email::parse(&raw) {
            let mailbox: Mailbox = email.as_str().parse().map_err(|e| TestCaseError::fail(format!("{raw:?}: {e}")))?;
            prop_assert!(mailbox.name.is_none());
            prop_assert_eq!(mailbox.email.to_string(), raw.clone());
            prop_assert!(raw.len() <= Email::MAX_LEN);
        }
    }

    #[test]
    fn ordinary_addresses_are_accepted(raw in address()) {
        prop_assert!(Email::parse(&raw).is_ok(), "{raw}");
    }

    #[test]
    fn field_order_whitespace_and_escaping_never_change_the_fingerprint(
        text in text(),
        notify in address(),
        ws_a in whitespace(),
        ws_b in whitespace(),
        order in any::<(bool, bool)>(),
        escape in any::<bool>(),
    ) {
        let a = parse_summary_request(body(&text, &notify, order.0, &ws_a, false).as_bytes(), WebhookRules::default()).unwrap();
        let b = parse_summary_request(body(&text, &notify, order.1, &ws_b, escape).as_bytes(), WebhookRules::default()).unwrap();
        prop_assert_eq!(a.fingerprint().unwrap(), b.fingerprint().unwrap());
    }

    #[test]
    fn any_change_of_a_value_changes_the_fingerprint(
        text in text(),
        other_text in text(),
        notify in address(),
        other_notify in address(),
    ) {
        let ws: [String; 8] = Default::default();
        let fp = |t: &str, n: &str| parse_summary_request(body(t, n, false, &ws, false).as_bytes(), WebhookRules::default()).unwrap().fingerprint().unwrap();
        let base = fp(&text, &notify);
        if other_text != text {
            prop_assert_ne!(&base, &fp(&other_text, &notify));
        }
        if other_notify != notify {
            prop_assert_ne!(&base, &fp(&text, &other_notify));
        }
        // The smallest edit too: one character more.
        prop_assert_ne!(&base, &fp(&format!("{text} "), &notify));
    }

    #[test]
    fn no_body_makes_the_parser_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_summary_request(&bytes, WebhookRules::default());
    }
}
