//! Which parts of summaryd this process runs (`--roles api,worker,relay`).

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Api,
    Worker,
    Relay,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Api, Role::Worker, Role::Relay];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Api => "api",
            Role::Worker => "worker",
            Role::Relay => "relay",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}; valid roles are api, worker, relay")]
pub struct UnknownRole(String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s.trim())
            .ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

/// A non-empty set of roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    api: bool,
    worker: bool,
    relay: bool,
}

impl Roles {
    pub fn all() -> Self {
        Self::of(&Role::ALL)
    }

    pub fn of(roles: &[Role]) -> Self {
        Self {
            api: roles.contains(&Role::Api),
            worker: roles.contains(&Role::Worker),
            relay: roles.contains(&Role::Relay),
        }
    }

    pub(crate) fn has(&self, role: Role) -> bool {
        match role {
            Role::Api => self.api,
            Role::Worker => self.worker,
            Role::Relay => self.relay,
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = Role> + '_ {
        Role::ALL.into_iter().filter(|r| self.has(*r))
    }

    /// Redis is needed by the api (idempotency, enqueue) and the worker (stream).
    pub(crate) fn needs_redis(&self) -> bool {
        self.api || self.worker
    }

    /// Postgres is needed by every role (api reads summaries for GET).
    pub(crate) fn needs_postgres(&self) -> bool {
        self.api || self.worker || self.relay
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Role::name).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for Roles {
    type Err = UnknownRole;
    /// Comma-separated; empty items are ignored, an unknown name is an error naming the valid ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let roles = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Role::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        if roles.is_empty() {
            return Err(UnknownRole(s.to_owned()));
        }
        Ok(Self::of(&roles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subsets_and_names_valid_roles_on_error() {
        let r: Roles = "worker,relay".parse().unwrap();
        assert!(!r.has(Role::Api) && r.has(Role::Worker) && r.has(Role::Relay));
        let err = "api,mailer".parse::<Roles>().unwrap_err().to_string();
        assert!(
            err.contains("mailer") && err.contains("api, worker, relay"),
            "{err}"
        );
        assert!("".parse::<Roles>().is_err());
    }
}
