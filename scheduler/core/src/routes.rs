//! The routing table of a cluster with several active schedulers (issue
//! 19): which scheduler group owns which models and which backends.
//!
//! A *group* is one election key (its leader and standbys, issue 18), the
//! models it alone plans and the backends of its sub-cluster. The table has
//! a revision that only grows; every node acts on the newest revision it
//! has seen and ignores older ones, so a table that arrives late (etcd
//! watch, a re-read after a reconnect) never undoes a move.
//!
//! Sans-IO: the table is a value. It is stored as JSON under one etcd key
//! (`Etcd::put_routes`/`get_routes`), written by `symphony route set`;
//! [`RouteTable::decode`] validates whatever bytes it is handed (a model
//! in two groups, two groups of one name, a missing field: an error, never
//! a panic).

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The etcd key the table lives under unless told otherwise.
pub const DEFAULT_ROUTES_KEY: &str = "/symphony/routes";

/// One scheduler group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteGroup {
    /// The group's name (what `--move MODEL=GROUP` names).
    pub name: String,
    /// Its leadership key in etcd (leader + standbys campaign on it).
    pub election_key: String,
    /// Control addresses of its schedulers, leader first if known: the
    /// list a frontend walks to reach the group.
    #[serde(default)]
    pub schedulers: Vec<String>,
    /// The models it owns, by name.
    pub models: Vec<String>,
    /// The backends of its sub-cluster (addresses or ids, as deployed).
    #[serde(default)]
    pub backends: Vec<String>,
}

/// The whole table (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTable {
    /// Grows with every change.
    pub revision: u64,
    /// The groups; each model is in at most one.
    pub groups: Vec<RouteGroup>,
}

/// Why a table is not valid.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RouteError {
    /// The bytes are not a table (the parser's error, shared so that the
    /// error stays `Clone`).
    #[error("not a routing table: {0}")]
    Malformed(#[source] Arc<serde_json::Error>),
    /// Two groups share a name.
    #[error("group {0:?} appears twice")]
    DuplicateGroup(String),
    /// A model is owned by two groups (or twice by one).
    #[error("model {model:?} is in group {first:?} and in group {second:?}")]
    DuplicateModel {
        /// The model.
        model: String,
        /// Its first group.
        first: String,
        /// The other.
        second: String,
    },
    /// A move names a group the table does not have.
    #[error("no group {0:?} in the table")]
    NoSuchGroup(String),
}

impl RouteTable {
    /// Parses and validates a table.
    pub fn decode(bytes: &[u8]) -> Result<RouteTable, RouteError> {
        let t: RouteTable = serde_json::from_slice(bytes).map_err(|e| RouteError::Malformed(Arc::new(e)))?;
        t.validate()?;
        Ok(t)
    }

    /// The table as JSON (what `decode` reads).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Checks that group names are unique and each model has one owner.
    pub fn validate(&self) -> Result<(), RouteError> {
        let mut names = std::collections::HashSet::new();
        let mut owner: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for g in &self.groups {
            if !names.insert(g.name.as_str()) {
                return Err(RouteError::DuplicateGroup(g.name.clone()));
            }
            for m in &g.models {
                if let Some(first) = owner.insert(m, &g.name) {
                    return Err(RouteError::DuplicateModel { model: m.clone(), first: first.into(), second: g.name.clone() });
                }
            }
        }
        Ok(())
    }

    /// The index of the group that owns `model`.
    pub fn owner(&self, model: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.models.iter().any(|m| m == model))
    }

    /// The index of the group named `name`.
    pub fn group(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.name == name)
    }

    /// The next revision with `model` owned by group `to` (taken from its
    /// previous owner, if any). Moving a model to its owner still bumps
    /// the revision (harmless).
    pub fn with_move(&self, model: &str, to: &str) -> Result<RouteTable, RouteError> {
        let to = self.group(to).ok_or_else(|| RouteError::NoSuchGroup(to.into()))?;
        let mut next = self.clone();
        for g in &mut next.groups {
            g.models.retain(|m| m != model);
        }
        next.groups[to].models.push(model.into());
        next.revision = self.revision + 1;
        Ok(next)
    }

    /// Which of `models` (the cluster's list, by index) group `group`
    /// owns: one flag per model. An unknown group owns nothing.
    pub fn owned_mask(&self, group: &str, models: &[String]) -> Vec<bool> {
        let g = self.group(group).map(|i| &self.groups[i]);
        models.iter().map(|m| g.is_some_and(|g| g.models.iter().any(|x| x == m))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn table() -> RouteTable {
        let g = |name: &str, models: &[&str]| RouteGroup {
            name: name.into(),
            election_key: format!("/symphony/leader/{name}"),
            schedulers: vec![format!("{name}-0:7000"), format!("{name}-1:7000")],
            models: models.iter().map(|m| m.to_string()).collect(),
            backends: vec![format!("{name}-gpu")],
        };
        RouteTable { revision: 1, groups: vec![g("a", &["ResNet50"]), g("b", &["InceptionV3"])] }
    }

    #[test]
    fn round_trips_and_moves_bump_the_revision() {
        let t = table();
        assert_eq!(RouteTable::decode(&t.encode()).ok(), Some(t.clone()));
        assert_eq!(t.owner("ResNet50"), Some(0));
        let m = t.with_move("ResNet50", "b").unwrap();
        assert_eq!((m.revision, m.owner("ResNet50")), (2, Some(1)));
        assert_eq!(m.groups[0].models, Vec::<String>::new());
        let names = vec!["ResNet50".to_string(), "InceptionV3".to_string()];
        assert_eq!(m.owned_mask("b", &names), [true, true]);
        assert_eq!(m.owned_mask("a", &names), [false, false]);
        assert_eq!(m.owned_mask("zz", &names), [false, false]);
        assert!(matches!(t.with_move("ResNet50", "zz"), Err(RouteError::NoSuchGroup(g)) if g == "zz"));
    }

    #[test]
    fn a_model_in_two_groups_or_a_repeated_group_is_refused() {
        let mut t = table();
        t.groups[1].models.push("ResNet50".into());
        assert!(matches!(RouteTable::decode(&t.encode()), Err(RouteError::DuplicateModel { .. })));
        let mut t = table();
        t.groups[1].name = "a".into();
        assert!(matches!(RouteTable::decode(&t.encode()), Err(RouteError::DuplicateGroup(g)) if g == "a"));
        let malformed = RouteTable::decode(b"{\"revision\":1}").unwrap_err();
        assert!(matches!(malformed, RouteError::Malformed(_)));
        // The parser's error is kept as the source, not only as text.
        let source = std::error::Error::source(&malformed).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("missing field `groups` at line 1 column 14"));
    }

    #[test]
    fn random_and_mutated_bytes_never_panic() {
        let good = table().encode();
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(19);
        for _ in 0..5000 {
            let mut b = good.clone();
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(0..b.len());
                match rng.random_range(0..3) {
                    0 => b[i] = rng.random(),
                    1 => b.truncate(i),
                    _ => b.insert(i, rng.random()),
                }
                if b.is_empty() {
                    break;
                }
            }
            let _ = RouteTable::decode(&b);
        }
    }
}
