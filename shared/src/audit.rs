//! What the three daemons' audit logs say a caller did: one table of actions, so that each
//! is named once (authd's log of tokens, routd's and runed's of what callers changed). A
//! row's action is stored and served as its wire name; rows written before an action was
//! renamed are read back as the text they hold. authd's names predate the dotted ones and
//! are kept, so its log reads the same across the change.

/// The id of the request an audit row is written for: the `x-request-id` the daemon answers
/// it with. The id travels on every call one daemon makes to another for that request, so a
/// row leads to the request's log lines and to the other daemons' rows of the same request
/// (a group deleted at routd, its folder retired at runed). `None` outside a request.
#[cfg(feature = "server")]
pub fn request_id() -> Option<String> {
    crate::http::current_request_id().map(|id| id.to_string())
}

/// An action a caller took that the audit log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditAction {
    /// routd: a group made or changed.
    GroupPut,
    /// routd: a group deleted (its folder retired at runed).
    GroupDelete,
    /// routd: a group registered by an agent's tool.
    GroupRegister,
    /// routd: a group spawned by an agent's tool.
    GroupSpawn,
    /// routd: a route added.
    RouteAdd,
    /// routd: a route deleted.
    RouteDelete,
    /// routd: a webhook added.
    WebhookAdd,
    /// routd: a webhook deleted.
    WebhookDelete,
    /// routd: a task scheduled by an agent's tool.
    TaskSchedule,
    /// routd: a task cancelled.
    TaskCancel,
    /// routd: a chat's session reset by an agent's tool.
    SessionReset,
    /// routd: an approval request made (a held call that asks a person).
    ApprovalRequest,
    /// routd: a verdict on an approval request (or one refused).
    ApprovalVerdict,
    /// routd: a person signed in to the web page.
    WebSignin,
    /// routd: a person signed out.
    WebSignout,
    /// routd: a web session ended by an operator or a revocation.
    WebSessionEnd,
    /// runed: a run asked for.
    RunCreate,
    /// runed: a follow-up placed into a live run.
    RunSteer,
    /// runed: a run killed.
    RunKill,
    /// runed: a run asked to stop (its input closed).
    RunStop,
    /// runed: a folder's slot held.
    HoldCreate,
    /// runed: a deleted group's folder retired.
    FolderRetire,
    /// runed: a brokered secret set.
    SecretSet,
    /// runed: a brokered secret removed.
    SecretRemove,
    /// runed: a media file written into a folder.
    MediaPut,
    /// authd: a daemon exchanged its service key for a token.
    ServiceToken,
    /// authd: a token minted (a user's, a run's spawn token).
    TokenMint,
    /// authd: a token revoked (with its children).
    TokenRevoke,
    /// authd: the signing key rotated.
    KeyRotate,
    /// authd: its first signing key created.
    KeyCreate,
    /// authd: its audit log read.
    AuditRead,
}

crate::wire_names!(AuditAction {
    GroupPut => "group.put",
    GroupDelete => "group.delete",
    GroupRegister => "group.register",
    GroupSpawn => "group.spawn",
    RouteAdd => "route.add",
    RouteDelete => "route.delete",
    WebhookAdd => "webhook.add",
    WebhookDelete => "webhook.delete",
    TaskSchedule => "task.schedule",
    TaskCancel => "task.cancel",
    SessionReset => "session.reset",
    ApprovalRequest => "approval.request",
    ApprovalVerdict => "approval.verdict",
    WebSignin => "web.signin",
    WebSignout => "web.signout",
    WebSessionEnd => "web.session.end",
    RunCreate => "run.create",
    RunSteer => "run.steer",
    RunKill => "run.kill",
    RunStop => "run.stop",
    HoldCreate => "hold.create",
    FolderRetire => "folder.retire",
    SecretSet => "secret.set",
    SecretRemove => "secret.remove",
    MediaPut => "media.put",
    ServiceToken => "service_token",
    TokenMint => "mint",
    TokenRevoke => "revoke",
    KeyRotate => "rotate",
    KeyCreate => "key_created",
    AuditRead => "audit_read",
});

/// How an audited action ended: a row's `outcome`, stored and served as its wire text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditOutcome<'a> {
    /// It was done: `ok`.
    Ok,
    /// It was refused: the refusal's code (as the caller was answered, or the reason a
    /// verdict was not taken).
    Refused(&'a str),
    /// An approval request made or decided: the request's state after it (`pending`,
    /// `approved`, `denied`, …).
    Approval(crate::approvals::ApprovalState),
    /// A follow-up handed to a live run: where it is (`placed`, or a repeat's `taken` or
    /// `returned`).
    Steer(crate::runs::SteerState),
    /// A browser session ended because its link was revoked: `revoked`.
    Revoked,
}

impl AuditOutcome<'_> {
    /// The wire text.
    pub fn as_str(&self) -> &str {
        match self {
            AuditOutcome::Ok => "ok",
            AuditOutcome::Refused(code) => code,
            AuditOutcome::Approval(state) => state.as_str(),
            AuditOutcome::Steer(state) => state.as_str(),
            AuditOutcome::Revoked => "revoked",
        }
    }
}

#[cfg(feature = "server")]
impl From<&'static crate::http::Code> for AuditOutcome<'static> {
    fn from(c: &'static crate::http::Code) -> Self {
        AuditOutcome::Refused(c.code)
    }
}

/// A row of runed's or routd's audit log, as stored and as `GET /v1/audit` serves it: who did
/// what, to which folder, turn and run, how it ended, for which request.
#[derive(Debug, Clone, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// Action and outcome are written from `AuditAction` and `AuditOutcome` and read back as the
// text stored (authd's log, written by its group-commit writer, has its own rows).
pub struct AuditRow {
    /// Row id.
    pub id: i64,
    /// Unix ms.
    pub at: i64,
    /// Token subject.
    pub actor: String,
    /// What was done (`group.put`, `run.create`, …).
    pub action: String,
    /// The folder, when one is concerned.
    pub folder: Option<String>,
    /// `ok`, a refusal's code, or the state an approval or a follow-up came to.
    pub outcome: String,
    /// Short facts (never a secret).
    pub detail: String,
    /// The request it was written for (the `x-request-id` the daemon answered): the other
    /// daemons' rows of the same request carry it too.
    pub request_id: Option<String>,
    /// The turn it concerns: the turn whose agent acted (routd), the turn a run was asked for
    /// (runed).
    pub turn_id: Option<String>,
    /// The run asked about (runed; as asked: a refused request may name no real run).
    pub run_id: Option<String>,
}

impl AuditRow {
    /// A row for what `actor` did now, keyed by the request being served.
    #[cfg(feature = "server")]
    pub fn new(
        actor: &str,
        action: AuditAction,
        folder: Option<&str>,
        outcome: AuditOutcome<'_>,
        detail: String,
    ) -> AuditRow {
        AuditRow {
            id: 0,
            at: crate::time::unix_millis(std::time::SystemTime::now()),
            actor: actor.to_owned(),
            action: action.as_str().to_owned(),
            folder: folder.map(str::to_owned),
            outcome: outcome.as_str().to_owned(),
            detail,
            request_id: request_id(),
            turn_id: None,
            run_id: None,
        }
    }

    /// The same row, naming the turn it concerns.
    pub fn turn(mut self, turn: Option<&str>) -> AuditRow {
        self.turn_id = turn.map(str::to_owned);
        self
    }

    /// The same row, naming the run it concerns.
    pub fn run(mut self, run: Option<&str>) -> AuditRow {
        self.run_id = run.map(str::to_owned);
        self
    }
}

/// The one place the `audit_log` table of runed and routd is written and read.
#[cfg(feature = "db")]
pub mod table {
    use super::AuditRow;
    use rusqlite::{Connection, params};

    /// Appends a row.
    pub fn insert(c: &Connection, a: &AuditRow) -> rusqlite::Result<()> {
        c.prepare_cached(
            "INSERT INTO audit_log \
             (at, actor, action, folder, outcome, detail, request_id, turn_id, run_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            a.at,
            a.actor,
            a.action,
            a.folder,
            a.outcome,
            a.detail,
            a.request_id,
            a.turn_id,
            a.run_id
        ])?;
        Ok(())
    }

    /// Rows newest first, ids below `before`, at most `limit`.
    pub fn page(
        c: &Connection,
        before: Option<i64>,
        limit: usize,
    ) -> rusqlite::Result<Vec<AuditRow>> {
        let mut st = c.prepare_cached(
            "SELECT id, at, actor, action, folder, outcome, detail, request_id, turn_id, run_id \
             FROM audit_log WHERE (?1 IS NULL OR id < ?1) ORDER BY id DESC LIMIT ?2",
        )?;
        st.query_map(params![before, limit as i64], |r| {
            Ok(AuditRow {
                id: r.get(0)?,
                at: r.get(1)?,
                actor: r.get(2)?,
                action: r.get(3)?,
                folder: r.get(4)?,
                outcome: r.get(5)?,
                detail: r.get(6)?,
                request_id: r.get(7)?,
                turn_id: r.get(8)?,
                run_id: r.get(9)?,
            })
        })?
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{AuditAction, AuditOutcome};
    use crate::approvals::ApprovalState;
    use crate::runs::SteerState;

    #[test]
    fn an_outcome_is_stored_as_its_wire_text() {
        for (o, text) in [
            (AuditOutcome::Ok, "ok"),
            (
                AuditOutcome::Refused("folder_forbidden"),
                "folder_forbidden",
            ),
            (AuditOutcome::Approval(ApprovalState::TimedOut), "timed_out"),
            (AuditOutcome::Steer(SteerState::Placed), "placed"),
            (AuditOutcome::Revoked, "revoked"),
        ] {
            assert_eq!(o.as_str(), text);
        }
        #[cfg(feature = "server")]
        assert_eq!(
            AuditOutcome::from(&crate::http::NOT_FOUND),
            AuditOutcome::Refused("not_found")
        );
    }

    #[test]
    fn each_action_has_its_own_name() {
        let mut names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), AuditAction::ALL.len());
        for a in AuditAction::ALL {
            assert_eq!(AuditAction::parse(a.as_str()), Some(a));
        }
    }
}
