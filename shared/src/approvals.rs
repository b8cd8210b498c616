//! Human approval of tool calls, on the wire: who may approve a group's held calls and how
//! long they wait ([`ApprovalPolicy`], part of a group's configuration), what a request looks
//! like ([`ApprovalView`]) and a verdict ([`VerdictBody`]). routd holds the calls an ask rule
//! (`?tool`, see [`crate::grants`]) matches; `specs/routd.md` tells the whole story.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::runs::HumanDuration;

/// How long a held call waits for a verdict when the group does not say.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// The longest wait a group may set (the turn's own deadline usually ends it first).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The most named approvers a group may list.
pub const MAX_SENDERS: usize = 64;

/// Who may answer a group's approval requests from the chat. The operator (an unbound
/// caller of `POST /v1/approvals/{id}`) may always answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Approvers {
    /// Anyone who writes in the request's chat (`/approve ID`), and callers of the API whose
    /// token covers the group's folder.
    #[default]
    Chat,
    /// Only the senders named in `senders`, in the request's chat; and the API as for `chat`.
    Senders,
    /// Only the operator, through the API or `hako approvals`.
    Operator,
}

/// A group's approval settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// Who may approve or deny from the chat.
    #[serde(default)]
    pub from: Approvers,
    /// The chat senders (the `sender` of their messages) who may answer, for `from: senders`.
    #[serde(default)]
    pub senders: Vec<String>,
    /// How long a held call waits for a verdict before it is denied (default 5m, at most 24h).
    #[serde(default)]
    pub wait: Option<HumanDuration>,
}

impl ApprovalPolicy {
    /// The wait, with the default.
    pub fn wait(&self) -> Duration {
        self.wait.map_or(DEFAULT_WAIT, |w| w.0)
    }

    /// Refuses settings that cannot work; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(w) = self.wait
            && !(Duration::from_secs(1)..=MAX_WAIT).contains(&w.0)
        {
            return Err("approvals.wait: between 1s and 24h".into());
        }
        if self.senders.len() > MAX_SENDERS {
            return Err(format!("approvals.senders: at most {MAX_SENDERS}"));
        }
        if self
            .senders
            .iter()
            .any(|s| s.is_empty() || s.len() > 256 || s.chars().any(char::is_control))
        {
            return Err("approvals.senders: 1-256 printable characters each".into());
        }
        if self.from == Approvers::Senders && self.senders.is_empty() {
            return Err("approvals.senders: name at least one sender for from: senders".into());
        }
        Ok(())
    }

    /// Whether `sender`, writing in the request's own chat, may answer it.
    pub fn admits_sender(&self, sender: &str) -> bool {
        match self.from {
            Approvers::Chat => true,
            Approvers::Senders => self.senders.iter().any(|s| s == sender),
            Approvers::Operator => false,
        }
    }
}

/// Where an approval request stands. A request leaves `pending` once, to one verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// The call is held, waiting.
    Pending,
    /// Someone approved it: the call ran.
    Approved,
    /// Someone denied it: the agent got an error.
    Denied,
    /// No verdict within the group's wait: denied.
    TimedOut,
    /// The turn ended (done, killed, timed out, `/stop`) while it waited: denied.
    TurnEnded,
    /// routd restarted while it waited (the agent's call was cut with it): denied.
    Abandoned,
}

crate::wire_names!(ApprovalState {
    Pending => "pending",
    Approved => "approved",
    Denied => "denied",
    TimedOut => "timed_out",
    TurnEnded => "turn_ended",
    Abandoned => "abandoned",
});

impl ApprovalState {
    /// Whether the call may run.
    pub fn runs(self) -> bool {
        self == ApprovalState::Approved
    }
}

/// An approval request, as routd serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalView {
    /// The request's id (`ap-…`): what `/approve` and `/deny` name.
    pub id: crate::ids::ApprovalId,
    /// The turn whose call is held.
    pub turn_id: crate::ids::TurnId,
    /// The group.
    pub folder: String,
    /// The chat it was asked in (the turn's chat): only its senders answer from a chat.
    pub chat_jid: String,
    /// The tool.
    pub tool: String,
    /// What the call acts on (a chat, a folder), if the tool has a target.
    pub target: Option<String>,
    /// The call's arguments as shown to people (long texts cut).
    pub arguments: serde_json::Value,
    /// Where it stands.
    pub state: ApprovalState,
    /// Who gave the verdict (`chat:<jid>:<sender>`, or the token's subject), when someone did.
    pub decided_by: Option<String>,
    /// Unix ms it was asked.
    pub requested_at: i64,
    /// Unix ms it is denied at without a verdict.
    pub expires_at: i64,
    /// Unix ms of the verdict.
    pub decided_at: Option<i64>,
}

/// `GET /v1/approvals` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalList {
    /// Newest first.
    pub approvals: Vec<ApprovalView>,
}

/// `POST /v1/approvals/{id}`: a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VerdictBody {
    /// Approve (`true`: the call runs) or deny it.
    pub approve: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_checked_and_admit_whom_they_say() {
        let p: ApprovalPolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(p.wait(), DEFAULT_WAIT);
        assert!(p.validate().is_ok() && p.admits_sender("anyone"));
        let named: ApprovalPolicy =
            serde_json::from_str(r#"{"from":"senders","senders":["alice"],"wait":"2m"}"#).unwrap();
        assert!(named.validate().is_ok());
        assert!(named.admits_sender("alice") && !named.admits_sender("bob"));
        assert_eq!(named.wait(), Duration::from_secs(120));
        let op: ApprovalPolicy = serde_json::from_str(r#"{"from":"operator"}"#).unwrap();
        assert!(!op.admits_sender("alice"));
        for bad in [
            r#"{"from":"senders"}"#,
            r#"{"wait":"0s"}"#,
            r#"{"wait":"2d"}"#,
            r#"{"senders":[""]}"#,
        ] {
            let p: ApprovalPolicy = serde_json::from_str(bad).unwrap();
            assert!(p.validate().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<ApprovalPolicy>(r#"{"who":"x"}"#).is_err());
    }

    #[test]
    fn states_round_trip() {
        for s in ApprovalState::ALL {
            assert_eq!(ApprovalState::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::from(s.as_str())
            );
        }
        assert!(ApprovalState::Approved.runs() && !ApprovalState::TimedOut.runs());
    }
}
