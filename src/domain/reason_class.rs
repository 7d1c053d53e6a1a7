use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a job was dead-lettered, as a machine-readable class: the worker writes it with the
/// dead letter (`stream/dead_letters.rs`), operators filter by it. One class per family of
/// the tenant's wording in `worker/dead_reason.rs`; the free-text reason keeps the detail.
///
/// Dead letters written before the class existed have none and read as [`Unknown`]
/// (`ReasonClass::Unknown`), as does a class this version does not know (one a newer
/// version wrote), so reading never fails on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonClass {
    /// Every delivery failed transiently (`SUMMARYD_WORKER_MAX_DELIVERIES`).
    MaxDeliveries,
    /// The model refused the request for good: a 4xx that is the job's fault, or input it
    /// says can never be summarised.
    ModelRefused,
    /// The model answered, but with nothing usable, or failed in a way nobody classified.
    ModelFailed,
    /// The model could not be reached in time (asked for only when an operator asks
    /// anyway: these failures are transient and do not dead-letter by themselves).
    ModelUnreachable,
    /// The text does not fit the model, even in parts, or would cost more calls than a job
    /// may make.
    TooLong,
    /// The stream entry is not a job, or its stored text is gone.
    InvalidJob,
    /// Postgres refused the summary's data.
    Unstorable,
    /// No class recorded (older dead letters) or one this version does not know.
    Unknown,
}

impl ReasonClass {
    /// Every class, in the order a console lists them.
    pub const ALL: [ReasonClass; 8] = [
        Self::MaxDeliveries,
        Self::ModelRefused,
        Self::ModelFailed,
        Self::ModelUnreachable,
        Self::TooLong,
        Self::InvalidJob,
        Self::Unstorable,
        Self::Unknown,
    ];

    /// The stored and displayed name; the only spelling of each class.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxDeliveries => "max_deliveries",
            Self::ModelRefused => "model_refused",
            Self::ModelFailed => "model_failed",
            Self::ModelUnreachable => "model_unreachable",
            Self::TooLong => "too_long",
            Self::InvalidJob => "invalid_job",
            Self::Unstorable => "unstorable",
            Self::Unknown => "unknown",
        }
    }

    /// The class named `raw` exactly, if there is one (for input: a console's filter).
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|class| class.as_str() == raw)
    }

    /// The class a stored dead letter carries: absent or unknown names are `Unknown`.
    pub fn from_stored(raw: Option<&str>) -> Self {
        raw.and_then(Self::parse).unwrap_or(Self::Unknown)
    }
}

impl fmt::Display for ReasonClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ReasonClass {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ReasonClass {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown reason class {raw:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_parses_back_from_its_name_and_names_are_distinct() {
        let mut names = std::collections::HashSet::new();
        for class in ReasonClass::ALL {
            assert_eq!(ReasonClass::parse(class.as_str()), Some(class));
            assert_eq!(class.to_string(), class.as_str());
            assert!(names.insert(class.as_str()), "{class} twice");
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.as_str()));
            assert_eq!(serde_json::from_str::<ReasonClass>(&json).unwrap(), class);
        }
    }

    #[test]
    fn parsing_is_exact_and_stored_values_fall_back_to_unknown() {
        for raw in ["", "MAX_DELIVERIES", " too_long", "too_long ", "webhook"] {
            assert_eq!(ReasonClass::parse(raw), None, "{raw:?}");
            assert_eq!(
                ReasonClass::from_stored(Some(raw)),
                ReasonClass::Unknown,
                "{raw:?}"
            );
        }
        assert_eq!(ReasonClass::from_stored(None), ReasonClass::Unknown);
        assert_eq!(
            ReasonClass::from_stored(Some("too_long")),
            ReasonClass::TooLong
        );
        assert!(serde_json::from_str::<ReasonClass>("\"webhook\"").is_err());
        assert_eq!(
            ReasonClass::parse("max_deliveries"),
            Some(ReasonClass::MaxDeliveries)
        );
        assert_eq!(ReasonClass::parse("unknown"), Some(ReasonClass::Unknown));
    }
}
