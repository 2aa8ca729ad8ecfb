//! The transport-independent API layer both the HTTP ([`crate::http`]) and
//! the gRPC ([`crate::grpc`]) servers call: model lookup, running a
//! validated request with its accounting, the protocol's error kinds and
//! the statistics extension. A transport only decodes its own encoding and
//! maps [`ErrorKind`] to its status codes, so both answer alike.

use crate::metrics::{ModelCounters, BATCH_BUCKETS};
use crate::models::ModelEntry;
use crate::service::{infer, InferResult, InferenceService, SubmitError};
use crate::staging::RequestOptions;
pub use crate::types::{BatchStats, CountNs, IndexEntry, ModelStats};
use dataplane::time::Duration;
use dataplane::wire::{DropReason, TaskStatus};

/// Triton's error kinds; HTTP and gRPC each map them to their codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed or mismatched request (HTTP 400, gRPC `INVALID_ARGUMENT`).
    InvalidArgument,
    /// Unknown model or version (HTTP 404, gRPC `NOT_FOUND`).
    NotFound,
    /// A drop for the model's deadline, an unloaded model, scheduler
    /// unreachable (HTTP 503, gRPC `UNAVAILABLE`).
    Unavailable,
    /// Refused at once for overload: the model's queue or the staging area
    /// is full; worth retrying soon (HTTP 503 with `Retry-After`, gRPC
    /// `UNAVAILABLE`).
    Overloaded,
    /// The request's own `timeout` ran out, or no outcome came within its
    /// deadline (HTTP 503, gRPC `DEADLINE_EXCEEDED`).
    DeadlineExceeded,
    /// The model failed on its backend and the like (HTTP 500, gRPC `INTERNAL`).
    Internal,
    /// Not offered by this server (HTTP 501, gRPC `UNIMPLEMENTED`).
    Unsupported,
    /// An admin call without the right credential (HTTP 401, gRPC
    /// `UNAUTHENTICATED`).
    Unauthenticated,
    /// An admin call on a server that has no admin credential configured:
    /// model control is off on the client ports (HTTP 403, gRPC
    /// `PERMISSION_DENIED`).
    PermissionDenied,
}

/// An error answer: its kind and the message the client sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// What kind of error.
    pub kind: ErrorKind,
    /// Why, for the client.
    pub message: String,
}

impl ApiError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
        }
    }
    /// An invalid-argument error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
}

impl From<crate::protocol::BadRequest> for ApiError {
    fn from(e: crate::protocol::BadRequest) -> Self {
        ApiError::invalid(e.0)
    }
}

/// The admin credential (issue 55): model control (load/unload) and the
/// repository index need `Authorization: Bearer <token>` (HTTP header or
/// gRPC metadata) with the token of `--admin-token-file`. Only a keyed
/// digest of the token is kept, and a presented token is compared with it
/// in constant time. Without one configured, those calls are refused on
/// the client ports (as Triton's restricted API), so a client that can
/// infer cannot unload a model and end the requests waiting for it.
#[derive(Clone, Copy)]
pub struct AdminCredential {
    tag: [u8; 32],
}

impl std::fmt::Debug for AdminCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminCredential(<digest>)")
    }
}

/// The shortest admin token accepted, bytes.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

impl AdminCredential {
    fn keyed(token: &[u8]) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        // HMAC takes keys of any length: this cannot fail.
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"symphony admin credential v1") else {
            unreachable!("HMAC accepts any key length")
        };
        mac.update(token);
        mac
    }

    /// The credential of `token` (surrounding ASCII whitespace removed, so
    /// a file's trailing newline is not part of it); `None` if shorter than
    /// [`MIN_ADMIN_TOKEN_LEN`].
    pub fn new(token: &[u8]) -> Option<AdminCredential> {
        use hmac::Mac;
        let token = token.trim_ascii();
        if token.len() < MIN_ADMIN_TOKEN_LEN {
            return None;
        }
        Some(AdminCredential { tag: Self::keyed(token).finalize().into_bytes().into() })
    }

    /// Whether `authorization` (an `Authorization` header's value) is
    /// `Bearer <token>` with this credential's token (constant time in the
    /// token).
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        use hmac::Mac;
        let Some(token) = authorization.and_then(|a| a.strip_prefix(b"Bearer ")) else { return false };
        Self::keyed(token.trim_ascii()).verify_slice(&self.tag).is_ok()
    }
}

/// The admin check of a model-control or repository call: `admin` is the
/// server's credential (none: the call is off), `authorization` what the
/// caller presented.
pub fn check_admin(admin: Option<&AdminCredential>, authorization: Option<&[u8]>) -> Result<(), ApiError> {
    match admin {
        None => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            "model control and the repository index are off on this port: start the frontend with --admin-token-file to allow them with that token",
        )),
        Some(a) if a.admits(authorization) => Ok(()),
        Some(_) => Err(ApiError::new(
            ErrorKind::Unauthenticated,
            "model control and the repository index need the admin credential (Authorization: Bearer <token>)",
        )),
    }
}

/// The model `name` (at `version`, if given and non-empty), or the
/// not-found error both transports send.
pub fn find_model<'s, S: InferenceService>(
    service: &'s S,
    name: &str,
    version: Option<&str>,
) -> Result<&'s ModelEntry, ApiError> {
    let version = version.filter(|v| !v.is_empty());
    service.model(name, version).ok_or_else(|| {
        ApiError::new(
            ErrorKind::NotFound,
            format!(
                "unknown model: '{name}'{}",
                version
                    .map(|v| format!(" version '{v}'"))
                    .unwrap_or_default()
            ),
        )
    })
}

/// Refuses a request for a model that is unloaded (model control).
pub fn check_loaded<S: InferenceService>(service: &S, model: &ModelEntry) -> Result<(), ApiError> {
    if service.model_states().is_loaded(model.id) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "model '{}' is unloaded (load it with POST /v2/repository/models/{}/load or RepositoryModelLoad)",
                model.spec.name, model.spec.name
            ),
        ))
    }
}

/// Whether model `name` (any version) is served and loaded.
pub fn model_ready<S: InferenceService>(service: &S, name: &str, version: Option<&str>) -> bool {
    find_model(service, name, version).is_ok_and(|m| service.model_states().is_loaded(m.id))
}

/// Loads (`load`) or unloads model `name` of the catalog (explicit model
/// control). A model outside the catalog cannot be loaded: the cluster's
/// model list is fixed when it forms.
pub fn set_loaded<S: InferenceService>(
    service: &S,
    name: &str,
    load: bool,
) -> Result<(), ApiError> {
    let model = service.catalog().by_name(name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::NotFound,
            format!(
                "unknown model: '{name}' (only models of the cluster's model list can be loaded)"
            ),
        )
    })?;
    service.model_states().set_loaded(model.id, load);
    Ok(())
}

/// The repository index: every model of the catalog and its state
/// (`ready_only`: the ready ones).
pub fn repository_index<S: InferenceService>(service: &S, ready_only: bool) -> Vec<IndexEntry> {
    service
        .catalog()
        .entries()
        .iter()
        .map(|m| {
            let loaded = service.model_states().is_loaded(m.id);
            IndexEntry {
                name: m.spec.name.clone(),
                version: m.version.clone(),
                state: if loaded { "READY" } else { "UNAVAILABLE" },
                reason: if loaded { "" } else { "unloaded" },
            }
        })
        .filter(|e| !ready_only || e.state == "READY")
        .collect()
}

/// Runs a validated request (`input`: exactly the model's input bytes)
/// that arrived at `started`, waits for its outcome and records it in the
/// metrics (the one place requests are counted). `budget` and
/// `options.timeout` run from `started`: the time spent decoding is
/// already gone. Dropping the future before it completes cancels the
/// request (a client that disconnected or cancelled its call).
pub async fn run_infer<S: InferenceService>(
    service: &S,
    model_id: u32,
    input: &[u8],
    budget: Duration,
    options: RequestOptions,
    started: std::time::Instant,
) -> Result<Vec<u8>, ApiError> {
    if let Some(model) = service.catalog().by_id(model_id) {
        check_loaded(service, model)?;
    }
    let spent = Duration::from_nanos(started.elapsed().as_nanos() as u64);
    let options = RequestOptions {
        timeout: options.timeout.map(|t| t.saturating_sub(spent)),
        ..options
    };
    // `infer` accounts for the outcome (the one accounting path).
    let (kind, message) = match infer(service, model_id, input, budget.saturating_sub(spent), options, started).await {
        InferResult::Ok(out) => return Ok(out),
        InferResult::Dropped(r) => (drop_kind(r), format!("request dropped: {}", r.as_str())),
        InferResult::Failed(TaskStatus::InputUnavailable) => (
            ErrorKind::Internal,
            "backend could not fetch the input".into(),
        ),
        InferResult::Failed(TaskStatus::Abandoned) => (
            ErrorKind::Unavailable,
            "the scheduler gave the request's batch up (its backend did not report in time or left); a retry may succeed".into(),
        ),
        InferResult::Failed(_) => (
            ErrorKind::Internal,
            "model execution failed on its backend (a model that failed to load there fails every request; the backend log says why)".into(),
        ),
        InferResult::Unloaded => (
            ErrorKind::Unavailable,
            {
                let name = service.catalog().by_id(model_id).map_or("?", |m| m.spec.name.as_str());
                format!("model '{name}' was unloaded while the request waited (load it again with POST /v2/repository/models/{name}/load or RepositoryModelLoad)")
            },
        ),
        InferResult::TimedOut => (
            ErrorKind::DeadlineExceeded,
            "no outcome within the request's deadline".into(),
        ),
        InferResult::Refused(SubmitError::UnknownModel) => {
            (ErrorKind::NotFound, "unknown model".into())
        }
        InferResult::Refused(SubmitError::BadInput(m)) => (ErrorKind::InvalidArgument, m),
        InferResult::Refused(SubmitError::Unavailable(m)) => {
            (ErrorKind::Overloaded, format!("overloaded: {m}"))
        }
        InferResult::Refused(SubmitError::SendFailed(m)) => (
            ErrorKind::Unavailable,
            format!("scheduler unreachable: {m}"),
        ),
        InferResult::Refused(SubmitError::Internal(m)) => (ErrorKind::Internal, m),
    };
    Err(ApiError::new(kind, message))
}

/// The error kind of a request the cluster dropped for `reason`.
pub fn drop_kind(reason: DropReason) -> ErrorKind {
    match reason {
        DropReason::Overloaded => ErrorKind::Overloaded,
        DropReason::Timeout => ErrorKind::DeadlineExceeded,
        _ => ErrorKind::Unavailable,
    }
}

/// `model`'s statistics from counters `c`.
pub fn model_stats(model: &ModelEntry, c: &ModelCounters) -> ModelStats {
    let ns = |us: u64| us.saturating_mul(1000);
    // Requests executed: the batch sizes reported to this frontend, at
    // least the successes (a daemon whose backends report no batches to
    // it still knows every success went through a queue and a model).
    let executed = c.batch_sum.max(c.success);
    let bounds = BATCH_BUCKETS.iter().copied();
    let batch_stats = bounds
        .chain(std::iter::once(
            BATCH_BUCKETS[BATCH_BUCKETS.len() - 1] + 1,
        ))
        .zip(c.batch_buckets.iter().copied())
        .filter(|&(_, n)| n > 0)
        .map(|(batch_size, n)| BatchStats {
            batch_size,
            compute_infer: CountNs { count: n, ns: 0 },
        })
        .collect();
    ModelStats {
        name: model.spec.name.clone(),
        version: model.version.clone(),
        last_inference: c.last_success_ms,
        inference_count: c.inference_count,
        execution_count: c.exec_count,
        success: CountNs {
            count: c.success,
            ns: ns(c.request_us.saturating_sub(c.failure_us)),
        },
        fail: CountNs {
            count: c.failure,
            ns: ns(c.failure_us),
        },
        queue: CountNs {
            count: executed,
            ns: ns(c.queue_us),
        },
        compute_input: CountNs {
            count: executed,
            ns: ns(c.compute_input_us),
        },
        compute_infer: CountNs {
            count: executed,
            ns: ns(c.compute_us),
        },
        compute_output: CountNs {
            count: executed,
            ns: ns(c.compute_output_us),
        },
        batch_stats,
    }
}

/// The statistics of model `name` (every version: the one served), or of
/// every model when `name` is empty.
pub fn statistics<S: InferenceService>(
    service: &S,
    name: &str,
    version: Option<&str>,
) -> Result<Vec<ModelStats>, ApiError> {
    let metrics = service.metrics();
    if name.is_empty() {
        return Ok(service
            .catalog()
            .entries()
            .iter()
            .map(|m| model_stats(m, &metrics.model_counters(m.id)))
            .collect());
    }
    let model = find_model(service, name, version)?;
    Ok(vec![model_stats(model, &metrics.model_counters(model.id))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_admin_token_as_a_bearer_passes() {
        let a = AdminCredential::new(b"an admin token of some length\n").unwrap();
        assert!(a.admits(Some(b"Bearer an admin token of some length")));
        assert!(!a.admits(Some(b"Bearer an admin token of some lengtH")));
        assert!(!a.admits(Some(b"an admin token of some length")));
        assert!(!a.admits(Some(b"Bearer ")));
        assert!(!a.admits(None));
        assert!(AdminCredential::new(b"short").is_none());
        assert_eq!(check_admin(None, Some(b"Bearer an admin token of some length")).unwrap_err().kind, ErrorKind::PermissionDenied);
        assert_eq!(check_admin(Some(&a), Some(b"Bearer wrong")).unwrap_err().kind, ErrorKind::Unauthenticated);
        assert!(check_admin(Some(&a), Some(b"Bearer an admin token of some length")).is_ok());
    }
}
