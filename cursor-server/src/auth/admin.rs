//! `cursor-server users add|list|disable|enable|set-budget`: managing people on the database at
//! run time (the file seeds them; these change them), from the command line or the console's
//! people page (`console/people.rs`). Each action is written to the audit log with who did it.
//! `add` prints the new token once: only its SHA-256 is stored.

use crate::config::auth::{Limits, normalize_email};
use crate::store::{Store, StoreError, users};

use super::service::{new_token, token_hash};

/// One `users` action.
#[derive(Debug, Clone, PartialEq)]
pub enum UsersAction {
    Add {
        email: String,
    },
    List,
    Disable {
        email: String,
    },
    Enable {
        email: String,
    },
    /// `limits`: a JSON object of limits (`{"daily_cost_usd": 5}`), replacing the stored ones.
    SetBudget {
        email: String,
        limits: String,
    },
}

/// Why an action could not be done.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0:?} is not an e-mail address")]
    Email(String),
    #[error("no user {0} (add them first with `cursor-server users add {0}`)")]
    NoSuchUser(String),
    #[error("the limits are not a JSON object of known limits: {0}")]
    Limits(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Does `action` from the command line and returns what to print.
pub async fn run(store: &Store, action: UsersAction) -> Result<String, AdminError> {
    run_by(store, "command line", action).await
}

/// Does `action` for `actor` (an admin's e-mail, or "command line"), audited under that name.
pub async fn run_by(store: &Store, actor: &str, action: UsersAction) -> Result<String, AdminError> {
    let email_of =
        |text: &str| normalize_email(text).ok_or_else(|| AdminError::Email(text.to_owned()));
    let audit = |action: &str, subject: &str, detail: Option<String>| users::AuditEntry {
        at_ms: users::now(),
        actor: Some(actor.to_owned()),
        action: action.to_owned(),
        subject: Some(subject.to_owned()),
        detail,
    };
    match action {
        UsersAction::Add { email } => {
            let email = email_of(&email)?;
            let token = new_token();
            users::add_token(store, &email, &token_hash(&token)).await?;
            users::audit(store, &audit("users add", &email, None)).await?;
            Ok(format!(
                "added a token for {email} (shown once, only its hash is stored):\n{token}"
            ))
        }
        UsersAction::List => {
            let mut out = String::from("email\tteam\trole\tstate\tlimits\n");
            for user in users::list(store).await? {
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    user.email,
                    user.team.as_deref().unwrap_or("-"),
                    if user.admin { "admin" } else { "member" },
                    if user.disabled { "disabled" } else { "enabled" },
                    user.limits.as_deref().unwrap_or("-"),
                ));
            }
            Ok(out)
        }
        UsersAction::Disable { email } => {
            set_disabled(store, actor, &email_of(&email)?, true).await
        }
        UsersAction::Enable { email } => {
            set_disabled(store, actor, &email_of(&email)?, false).await
        }
        UsersAction::SetBudget { email, limits } => {
            let email = email_of(&email)?;
            let parsed: Limits =
                serde_json::from_str(&limits).map_err(|e| AdminError::Limits(e.to_string()))?;
            if let Some(why) = parsed.problem() {
                return Err(AdminError::Limits(why));
            }
            let stored =
                serde_json::to_string(&parsed).map_err(|e| AdminError::Limits(e.to_string()))?;
            if !users::set_limits(store, &email, &stored).await? {
                return Err(AdminError::NoSuchUser(email));
            }
            users::audit(
                store,
                &audit("users set-budget", &email, Some(stored.clone())),
            )
            .await?;
            Ok(format!("{email}: limits {stored}"))
        }
    }
}

async fn set_disabled(
    store: &Store,
    actor: &str,
    email: &str,
    disabled: bool,
) -> Result<String, AdminError> {
    if !users::set_disabled(store, email, disabled).await? {
        return Err(AdminError::NoSuchUser(email.to_owned()));
    }
    let action = if disabled {
        "users disable"
    } else {
        "users enable"
    };
    let entry = users::AuditEntry {
        at_ms: users::now(),
        actor: Some(actor.to_owned()),
        action: action.to_owned(),
        subject: Some(email.to_owned()),
        detail: None,
    };
    users::audit(store, &entry).await?;
    Ok(format!(
        "{email}: {}",
        if disabled { "disabled" } else { "enabled" }
    ))
}
