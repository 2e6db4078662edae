//! The label sets of the metrics: [`Decision`], the one label value of the crate's own, and a
//! struct per combination of labels a family is keyed by.

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// What one limit decided for one request: the `decision` label of
/// `tollgate_limit_decisions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// the request was within the limit
    Allowed,
    /// the request was over the limit and was refused
    Denied,
    /// the request was over a limit in shadow mode: counted, but let through
    ShadowDenied,
    /// the request was admitted after a wait for its slot (`leaky_bucket`)
    Delayed,
}

impl Decision {
    /// The label value: `allowed`, `denied`, `shadow_denied` or `delayed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::ShadowDenied => "shadow_denied",
            Decision::Delayed => "delayed",
        }
    }
}

impl EncodeLabelValue for Decision {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

// Label sets. Names are `Arc<str>` so that recording a known series clones a pointer instead
// of allocating; kinds and results are `&'static str` for the same reason.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteStatus {
    pub(super) route: Arc<str>,
    pub(super) status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabel {
    pub(super) route: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    pub(super) route: Arc<str>,
    pub(super) limit: Arc<str>,
    pub(super) decision: Decision,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamLabel {
    pub(super) upstream: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamKind {
    pub(super) upstream: Arc<str>,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ChargeLabels {
    pub(super) route: Arc<str>,
    pub(super) limit: Arc<str>,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    pub(super) result: &'static str,
}
