//! Who may use the console: `SUMMARYD_CONSOLE_USERS_FILE` (`docs/console.md`).
//!
//! The file is read again whenever it is consulted (a sign-in, every signed-in request), so
//! removing a user or lowering a role takes effect on that user's next request, with no
//! signal and no restart. A file that stops parsing changes nothing: the last good version
//! stays in use and the error is logged once per version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use arc_swap::ArcSwap;
use argon2::password_hash::PasswordVerifier;
use argon2::password_hash::phc::PasswordHash;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a user may do: viewers read, operators also act (replay, purge, retry, pause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    #[error("SUMMARYD_CONSOLE_USERS_FILE {path}: {reason}")]
    Invalid { path: String, reason: String },
}

#[derive(Debug, Clone)]
enum Password {
    /// A PHC string (`$argon2id$v=19$m=…`), checked when the file is loaded.
    Argon2(String),
    /// The SHA-256 of the password: accepted for tooling that cannot make argon2 hashes,
    /// weaker against a stolen file (unsalted, fast), as `docs/console.md` says.
    Sha256([u8; 32]),
}

#[derive(Debug, Clone)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) role: Role,
    password: Password,
    /// SHA-256 of the user's API token for `/console/api/` scripts, if they have one.
    token_sha256: Option<[u8; 32]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    users: BTreeMap<String, FileUser>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUser {
    password_argon2: Option<String>,
    password_sha256: Option<String>,
    role: Role,
    token_sha256: Option<String>,
}

/// One version of the users file.
#[derive(Debug, Default)]
pub(crate) struct UserSet {
    users: BTreeMap<String, User>,
}

/// What user names may be: they appear in logs and in the pause record.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

fn sha256_hex(field: &str, user: &str, hex_text: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(hex_text.trim())
        .map_err(|_| format!("users.{user}.{field} must be 64 hex digits"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("users.{user}.{field} must be 64 hex digits"))
}

impl UserSet {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let file: FileFormat = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut users = BTreeMap::new();
        let mut tokens: Vec<[u8; 32]> = Vec::new();
        for (name, entry) in file.users {
            if !valid_name(&name) {
                return Err(format!(
                    "user name {name:?}: 1-64 characters of letters, digits, '.', '_', '-', '@'"
                ));
            }
            let password = match (entry.password_argon2, entry.password_sha256) {
                (Some(phc), None) => {
                    let parsed = PasswordHash::new(&phc).map_err(|e| {
                        format!("users.{name}.password_argon2 is not a PHC hash string: {e}")
                    })?;
                    if !parsed.algorithm.as_str().starts_with("argon2") {
                        return Err(format!(
                            "users.{name}.password_argon2 must be an argon2 hash ($argon2id$...)"
                        ));
                    }
                    Password::Argon2(phc)
                }
                (None, Some(hex_text)) => {
                    Password::Sha256(sha256_hex("password_sha256", &name, &hex_text)?)
                }
                _ => {
                    return Err(format!(
                        "users.{name} needs exactly one of password_argon2 or password_sha256"
                    ));
                }
            };
            let token_sha256 = match entry.token_sha256 {
                Some(hex_text) => {
                    let token = sha256_hex("token_sha256", &name, &hex_text)?;
                    if tokens.contains(&token) {
                        return Err(format!("users.{name}.token_sha256 is another user's too"));
                    }
                    tokens.push(token);
                    Some(token)
                }
                None => None,
            };
            users.insert(
                name.clone(),
                User {
                    name,
                    role: entry.role,
                    password,
                    token_sha256,
                },
            );
        }
        Ok(Self { users })
    }

    pub(crate) fn len(&self) -> usize {
        self.users.len()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// The user `name` if `password` is theirs. Costs about the same whether or not the user
    /// exists, so the time of an answer does not tell which names do.
    pub(crate) fn check_password(&self, name: &str, password: &str) -> Option<&User> {
        let Some(user) = self.users.get(name) else {
            // Same work as a real check, against a hash no password matches.
            let _ = verify_argon2(&DECOY, password);
            return None;
        };
        let ok = match &user.password {
            Password::Argon2(phc) => verify_argon2(phc, password),
            Password::Sha256(expected) => {
                let got: [u8; 32] = Sha256::digest(password.as_bytes()).into();
                bool::from(got.ct_eq(expected))
            }
        };
        ok.then_some(user)
    }

    /// The user whose API token this is. Every user's hash is compared, in constant time,
    /// so neither the answer's time nor its path tells how much of a token matched.
    pub(crate) fn by_token(&self, token: &str) -> Option<&User> {
        let got: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for user in self.users.values() {
            if let Some(expected) = &user.token_sha256
                && bool::from(got.ct_eq(expected))
            {
                found = Some(user);
            }
        }
        found
    }
}

/// A hash of a random password nobody knows, with argon2's default cost, made once.
static DECOY: LazyLock<String> = LazyLock::new(|| {
    use argon2::password_hash::PasswordHasher;
    let secret: [u8; 16] = rand::random();
    argon2::Argon2::default()
        .hash_password(&secret)
        .map(|h| h.to_string())
        .unwrap_or_default()
});

fn verify_argon2(phc: &str, password: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|hash| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok()
    })
}

/// The users file as last read successfully.
pub struct Users {
    path: PathBuf,
    current: ArcSwap<UserSet>,
    /// The content last acted on, so a broken version is logged once, not per request.
    seen: Mutex<String>,
}

impl Users {
    /// Read and check `path`: an unreadable or invalid file stops the start (exit 2), as a
    /// broken tokens file does.
    pub fn load(path: &Path) -> Result<Self, UsersError> {
        let invalid = |reason: String| UsersError::Invalid {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        let set = UserSet::parse(&text).map_err(invalid)?;
        if set.len() == 0 {
            tracing::warn!(path = %path.display(), "the console users file has no users; nobody can sign in");
        }
        Ok(Self {
            path: path.to_path_buf(),
            current: ArcSwap::from_pointee(set),
            seen: Mutex::new(text),
        })
    }

    /// The users as the file says now; the last good version when it cannot be read or
    /// does not parse.
    pub(crate) async fn current(&self) -> Arc<UserSet> {
        match tokio::fs::read_to_string(&self.path).await {
            Ok(text) => {
                let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                if *seen != text {
                    match UserSet::parse(&text) {
                        Ok(set) => {
                            tracing::info!(
                                users = set.len(),
                                "console users file changed: reloaded"
                            );
                            self.current.store(Arc::new(set));
                        }
                        Err(reason) => tracing::error!(
                            path = %self.path.display(), %reason,
                            "console users file changed but does not parse; the previous one stays in use"
                        ),
                    }
                    *seen = text;
                }
            }
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e,
                "console users file cannot be read; the loaded one stays in use"),
        }
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argon2::password_hash::PasswordHasher;

    fn sha(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    fn argon(password: &str) -> String {
        argon2::Argon2::default()
            .hash_password(password.as_bytes())
            .unwrap()
            .to_string()
    }

    #[test]
    fn argon2_and_sha256_passwords_check() {
        let text = format!(
            "[users.alice]\npassword_argon2 = \"{}\"\nrole = \"operator\"\n\
             [users.bob]\npassword_sha256 = \"{}\"\nrole = \"viewer\"\n",
            argon("alice-pw"),
            sha("bob-pw")
        );
        let set = UserSet::parse(&text).unwrap();
        assert_eq!(set.len(), 2);
        let alice = set.check_password("alice", "alice-pw").unwrap();
        assert_eq!((alice.name.as_str(), alice.role), ("alice", Role::Operator));
        assert!(set.check_password("alice", "bob-pw").is_none());
        assert_eq!(
            set.check_password("bob", "bob-pw").unwrap().role,
            Role::Viewer
        );
        assert!(set.check_password("bob", "bob-pw ").is_none());
        assert!(set.check_password("carol", "bob-pw").is_none());
    }

    #[test]
    fn tokens_find_their_user_only() {
        let text = format!(
            "[users.ci]\npassword_sha256 = \"{}\"\nrole = \"operator\"\ntoken_sha256 = \"{}\"\n\
             [users.dash]\npassword_sha256 = \"{}\"\nrole = \"viewer\"\ntoken_sha256 = \"{}\"\n",
            sha("x"),
            sha("ci-token"),
            sha("y"),
            sha("dash-token")
        );
        let set = UserSet::parse(&text).unwrap();
        assert_eq!(set.by_token("ci-token").unwrap().name, "ci");
        assert_eq!(set.by_token("dash-token").unwrap().role, Role::Viewer);
        assert!(set.by_token("ci-token2").is_none());
        assert!(set.by_token("").is_none());
    }

    #[test]
    fn invalid_files_name_what_to_fix() {
        let cases = [
            ("[users.a]\nrole = \"operator\"\n", "exactly one of"),
            (
                &format!(
                    "[users.a]\nrole = \"operator\"\npassword_sha256 = \"{}\"\npassword_argon2 = \"{}\"\n",
                    sha("x"),
                    argon("x")
                ),
                "exactly one of",
            ),
            (
                "[users.a]\nrole = \"operator\"\npassword_sha256 = \"abc\"\n",
                "64 hex digits",
            ),
            (
                &format!(
                    "[users.a]\nrole = \"admin\"\npassword_sha256 = \"{}\"\n",
                    sha("x")
                ),
                "unknown variant",
            ),
            (
                "[users.a]\nrole = \"viewer\"\npassword_argon2 = \"plain\"\n",
                "PHC",
            ),
            (
                &format!(
                    "[users.\"a b\"]\nrole = \"viewer\"\npassword_sha256 = \"{}\"\n",
                    sha("x")
                ),
                "user name",
            ),
            (
                &format!(
                    "[users.a]\nrole = \"viewer\"\npassword_sha256 = \"{s}\"\ntoken_sha256 = \"{t}\"\n\
                     [users.b]\nrole = \"viewer\"\npassword_sha256 = \"{s}\"\ntoken_sha256 = \"{t}\"\n",
                    s = sha("x"),
                    t = sha("t")
                ),
                "another user's",
            ),
            (
                &format!(
                    "[users.a]\nrole = \"viewer\"\npassword_sha256 = \"{}\"\nextra = 1\n",
                    sha("x")
                ),
                "unknown field",
            ),
        ];
        for (text, expected) in cases {
            let err = UserSet::parse(text).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn names_are_limited() {
        assert!(valid_name("alice"));
        assert!(valid_name("a.b_c-d@example"));
        assert!(!valid_name(""));
        assert!(!valid_name(&"a".repeat(65)));
        assert!(valid_name(&"a".repeat(64)));
        assert!(!valid_name("a b"));
        assert!(!valid_name("a/b"));
    }

    #[tokio::test]
    async fn a_changed_file_applies_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        let v1 = format!(
            "[users.a]\nrole = \"operator\"\npassword_sha256 = \"{}\"\n",
            sha("x")
        );
        std::fs::write(&path, &v1).unwrap();
        let users = Users::load(&path).unwrap();
        assert_eq!(users.current().await.get("a").unwrap().role, Role::Operator);
        let v2 = v1.replace("operator", "viewer");
        std::fs::write(&path, &v2).unwrap();
        assert_eq!(users.current().await.get("a").unwrap().role, Role::Viewer);
        std::fs::write(&path, "not toml [").unwrap();
        assert_eq!(users.current().await.get("a").unwrap().role, Role::Viewer);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(users.current().await.len(), 1);
    }
}
