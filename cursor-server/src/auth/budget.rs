//! Budgets and limits per person (`[auth]`): before each provider call, the run's person must be
//! allowed the model, under their cost and token limits for the day and the month, under their
//! requests per minute and concurrent runs; after each call its cost and tokens are charged to the
//! person and their team. Counters live in the store (`store/budgets.rs`), so every node enforces
//! the same budget; a call in flight always finishes, the next one is refused.
//!
//! A person's limits are their own (`[[users]]`, `users set-budget`) over their team's; a team's
//! limits are thus each member's unless the member has their own. A team's `[teams.total]` limits
//! the sum of its members' spending, from the same counters (every call is charged to both).
//!
//! Calls running side by side (parallel subagents, several runs, several nodes) are checked
//! before any of them is charged, so each node also counts its person's calls in flight
//! (`CallsInFlight`): a second call starts only while the headroom under every hard limit holds
//! all of this node's calls in flight, each as large as the largest call charged here, times the
//! live nodes (which share the headroom; counted in the same read as the counters, so a node that
//! just joined counts at once); else it waits for one to end. The first call on a node
//! always starts, so a person never spends more than a limit plus one call per node.

use std::sync::{Arc, Mutex};

use crate::config::ModelConfig;
use crate::config::auth::Limits;
use crate::model::usage::Usage;
use crate::ops::metrics;
use crate::provider::{Gate, ProviderError};
use crate::state::AppState;
use crate::store::budgets::{self, Charge, Spent};
use crate::store::now_ms;

use super::service::Admitted;

/// The check before a call on `model_id` by run `request_id`, and the place its admission is
/// held until the call is charged; `None` without `[auth]`.
pub fn gate(app: &Arc<AppState>, request_id: &str, model_id: &str) -> Option<(Gate, CallSlot)> {
    let email = app.auth.as_ref()?.owner_of_run(request_id)?;
    let app = Arc::clone(app);
    let model = model_id.to_owned();
    let slot = CallSlot::default();
    let held = slot.clone();
    let gate: Gate = Box::pin(async move {
        let admitted = check(&app, &email, &model).await?;
        *held.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(admitted);
        Ok(())
    });
    Some((gate, slot))
}

/// Where an admitted call's place among its person's calls in flight is held: released once the
/// call is charged (`release`), or when the call is dropped.
#[derive(Clone, Default)]
pub struct CallSlot(Arc<Mutex<Option<Admitted>>>);

impl CallSlot {
    pub fn release(&self) {
        let admitted = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(admitted);
    }
}

/// Whether one more call fits beside `in_flight` others on this node under a hard limit `cap` of
/// which `spent` is used: the first always does; more only when every call in flight here, as
/// large as `largest` (unknown: none charged yet), times the `nodes` sharing the headroom, fits.
fn fits_beside(in_flight: u32, cap: i64, spent: i64, largest: Option<i64>, nodes: usize) -> bool {
    if in_flight == 0 {
        return true;
    }
    let Some(largest) = largest else {
        return false;
    };
    let wanted = (i128::from(in_flight) + 1)
        .saturating_mul(i128::from(largest))
        .saturating_mul(nodes as i128);
    wanted <= i128::from(cap) - i128::from(spent)
}

/// The person's limits in force and their team.
async fn limits_of(app: &AppState, email: &str) -> Result<(Limits, Option<String>), ProviderError> {
    let auth = app
        .auth
        .as_ref()
        .ok_or_else(|| refused("no [auth]".to_owned()))?;
    let record = auth
        .person(&app.store, email)
        .await
        .map_err(|e| refused(format!("the budget could not be read: {e}")))?;
    let team = record.as_ref().and_then(|r| r.team.clone());
    let own = record.as_ref().and_then(|r| r.limits.as_deref());
    let (_, in_force) = auth.config.limits_of(team.as_deref(), own);
    Ok((in_force, team))
}

fn refused(message: String) -> ProviderError {
    ProviderError::OverBudget(message)
}

/// The checks before a call; `Ok` is the call's place among its person's calls in flight.
async fn check(app: &AppState, email: &str, model: &str) -> Result<Admitted, ProviderError> {
    let (limits, team) = limits_of(app, email).await?;
    let team_label = team.clone().unwrap_or_else(|| "none".to_owned());
    let ask = app
        .auth
        .as_ref()
        .map(|a| a.config.admins.join(", "))
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "the server's operator".to_owned());
    let refuse = |who: &str, limit: &'static str, what: String, resets: Option<String>| {
        metrics::budget_event(&team_label, "refused", limit);
        let resets = resets
            .map(|r| format!("; it resets at {r}"))
            .unwrap_or_default();
        let message =
            format!("{who} reached the {limit} limit ({what}){resets}; ask {ask} to raise it");
        if let Some(auth) = &app.auth {
            let what = format!("a provider call on {model}");
            auth.audit_refusal(&app.store, Some(email.to_owned()), what, message.clone());
        }
        refused(message)
    };
    if let Some(models) = &limits.models
        && !models.iter().any(|pattern| matches(pattern, model))
    {
        return Err(refuse(
            email,
            "models",
            format!("{model} is not among {}", models.join(", ")),
            None,
        ));
    }
    let store_failed = |e| refused(format!("the budget could not be read: {e}"));
    let auth = app
        .auth
        .as_ref()
        .ok_or_else(|| refused("no [auth]".to_owned()))?;
    // The team's counters only matter when the team has a total.
    let total = team.as_deref().and_then(|name| {
        let team = auth.config.team(name)?;
        Some((name, team.total.clone()?))
    });
    let asked = budgets::Asked {
        team: total.as_ref().map(|(name, _)| *name),
        runs: limits.concurrent_runs.is_some(),
        lease_ms: app.cluster.as_ref().map(|c| c.lease_ms()),
    };
    let (periods, admitted) = loop {
        // Registered before looking, so a call ending meanwhile is not missed.
        let released = auth.calls.released.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        let periods = Periods::at(now_ms());
        let standing = budgets::standing(&app.store, email, &periods.keys(), asked)
            .await
            .map_err(store_failed)?;
        // The nodes sharing the headroom, this one included (none counted: a single node).
        let nodes = usize::try_from(standing.live_nodes.max(1)).unwrap_or(1);
        let [day, month, _] = standing.person;
        if let Some((limit, what, reset)) =
            spending(&limits, [day, month], &periods, |limit, what| {
                metrics::budget_event(&team_label, "warned", limit);
                tracing::warn!(user = email, limit, "{what}");
            })
        {
            return Err(refuse(email, limit, what, Some(reset)));
        }
        if let Some((name, total)) = &total {
            let [day, month, _] = standing.team;
            if let Some((limit, what, reset)) =
                spending(total, [day, month], &periods, |limit, what| {
                    metrics::budget_event(&team_label, "warned", limit);
                    tracing::warn!(team = name, limit, "the team's total: {what}");
                })
            {
                let who = format!("team {name} (all its members together)");
                return Err(refuse(&who, limit, what, Some(reset)));
            }
        }
        if let Some(most) = limits.concurrent_runs {
            let running = standing.running;
            if running > i64::from(most) {
                return Err(refuse(
                    email,
                    "concurrent_runs",
                    format!("{running} runs at once of {most}"),
                    None,
                ));
            }
        }
        let hard = hard_caps(&limits, standing.person)
            .into_iter()
            .chain(total.iter().flat_map(|(_, t)| hard_caps(t, standing.team)));
        let hard: Vec<(i64, i64, Metric)> = hard.collect();
        let admitted = auth.calls.try_admit(email, |in_flight, largest| {
            hard.iter().all(|(cap, spent, metric)| {
                fits_beside(
                    in_flight,
                    *cap,
                    *spent,
                    largest.map(|l| metric.of(&l)),
                    nodes,
                )
            })
        });
        match admitted {
            Some(admitted) => break (periods, admitted),
            // Near a hard limit with calls of theirs in flight here: wait for one to end.
            None => released.await,
        }
    };
    // Last, as it counts the call: one conditional increment, so calls racing on several nodes
    // cannot all pass a count they read before any of them wrote.
    if let Some(rpm) = limits.requests_per_minute {
        let counted = budgets::count_call(
            &app.store,
            &format!("user:{email}"),
            &periods.minute,
            i64::from(rpm),
        )
        .await
        .map_err(|e| refused(format!("the budget could not be written: {e}")))?;
        if !counted {
            return Err(refuse(
                email,
                "requests_per_minute",
                format!("{rpm} calls this minute of {rpm}"),
                Some(periods.minute_reset.clone()),
            ));
        }
    }
    Ok(admitted)
}

/// What a hard limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Cost,
    Tokens,
}

impl Metric {
    fn of(self, spent: &Spent) -> i64 {
        match self {
            Metric::Cost => spent.cost_micro_usd,
            Metric::Tokens => spent.tokens,
        }
    }
}

/// The period a hard limit counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    Day,
    Month,
}

/// The four hard limits on cost and tokens: (name, cap if set, period, what it counts). The one
/// list both the refusal (`spending`) and the admission beside calls in flight (`hard_caps`) read.
fn hard_limits(limits: &Limits) -> [(&'static str, Option<i64>, Span, Metric); 4] {
    [
        (
            "daily_cost_usd",
            limits.daily_cost_usd.map(usd),
            Span::Day,
            Metric::Cost,
        ),
        (
            "monthly_cost_usd",
            limits.monthly_cost_usd.map(usd),
            Span::Month,
            Metric::Cost,
        ),
        (
            "daily_tokens",
            limits.daily_tokens.map(as_i64),
            Span::Day,
            Metric::Tokens,
        ),
        (
            "monthly_tokens",
            limits.monthly_tokens.map(as_i64),
            Span::Month,
            Metric::Tokens,
        ),
    ]
}

/// Every hard cost and token limit set in `limits`, as (cap, spent in its period, what it counts).
fn hard_caps(limits: &Limits, [day, month, _]: [Spent; 3]) -> Vec<(i64, i64, Metric)> {
    hard_limits(limits)
        .into_iter()
        .filter_map(|(_, cap, span, metric)| {
            let spent = match span {
                Span::Day => &day,
                Span::Month => &month,
            };
            Some((cap?, metric.of(spent), metric))
        })
        .collect()
}

/// The first hard limit on cost or tokens that `[day, month]` reached, as (limit, what was
/// spent of what, when it resets); each soft limit reached is passed to `warn` (limit, text).
fn spending(
    limits: &Limits,
    [day, month]: [Spent; 2],
    periods: &Periods,
    mut warn: impl FnMut(&'static str, String),
) -> Option<(&'static str, String, String)> {
    for (limit, cap, span, metric) in hard_limits(limits) {
        let (spent, reset) = match span {
            Span::Day => (metric.of(&day), &periods.day_reset),
            Span::Month => (metric.of(&month), &periods.month_reset),
        };
        if let Some(cap) = cap
            && spent >= cap
        {
            return Some((limit, shown(limit, spent, cap), reset.clone()));
        }
    }
    let soft = [
        (
            "soft_daily_cost_usd",
            limits.soft_daily_cost_usd.map(usd),
            day.cost_micro_usd,
        ),
        (
            "soft_monthly_cost_usd",
            limits.soft_monthly_cost_usd.map(usd),
            month.cost_micro_usd,
        ),
        (
            "soft_daily_tokens",
            limits.soft_daily_tokens.map(as_i64),
            day.tokens,
        ),
        (
            "soft_monthly_tokens",
            limits.soft_monthly_tokens.map(as_i64),
            month.tokens,
        ),
    ];
    for (limit, cap, spent) in soft {
        if let Some(cap) = cap
            && spent >= cap
        {
            warn(limit, shown(limit, spent, cap));
        }
    }
    None
}

/// What a call of run `request_id` charges to its person and their team, for the day and the
/// month (`None` without `[auth]` or for a run this node did not admit for a person); written
/// with the call's record (`store::budgets::record_charged_call`).
pub async fn charge_of(
    app: &AppState,
    request_id: &str,
    model: &ModelConfig,
    usage: &Usage,
) -> Option<Charge> {
    let auth = app.auth.as_ref()?;
    let email = auth.owner_of_run(request_id)?;
    let cost = model
        .pricing
        .and_then(|p| p.cost(usage))
        .map_or(0, |usd| (usd * 1_000_000.0).round() as i64);
    let spent = Spent {
        cost_micro_usd: cost,
        tokens: as_i64(tokens_of(usage)),
        calls: 1,
    };
    auth.calls.charged(&email, spent);
    let team = match auth.person(&app.store, &email).await {
        Ok(record) => record.and_then(|r| r.team),
        Err(e) => {
            // The person's own counters are still charged; the team's total misses this call.
            tracing::warn!(user = %email, "reading a person's team to charge their call: {e}");
            None
        }
    };
    let mut scopes = vec![format!("user:{email}")];
    scopes.extend(team.map(|t| format!("team:{t}")));
    let periods = Periods::at(now_ms());
    Some(Charge {
        scopes,
        periods: vec![periods.day, periods.month],
        spent,
    })
}

/// What `scope` (`user:EMAIL`, `team:NAME`) spent today and this month (UTC), for the console.
pub async fn spent_now(
    store: &crate::store::Store,
    scope: &str,
) -> Result<[Spent; 2], crate::store::StoreError> {
    let periods = Periods::at(now_ms());
    let [day, month, _] = budgets::read(store, scope, &periods.keys()).await?;
    Ok([day, month])
}

/// The tokens a call counts against token limits: input (with cache reads and writes) and output.
pub fn tokens_of(usage: &Usage) -> u64 {
    [
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    ]
    .iter()
    .map(|t| t.unwrap_or(0))
    .sum()
}

fn usd(dollars: f64) -> i64 {
    (dollars * 1_000_000.0).round() as i64
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn shown(limit: &str, spent: i64, cap: i64) -> String {
    if limit.contains("cost") {
        format!(
            "${:.4} spent of ${:.4}",
            spent as f64 / 1e6,
            cap as f64 / 1e6
        )
    } else {
        format!("{spent} tokens used of {cap}")
    }
}

/// A model name against a pattern with `*` wildcards.
fn matches(pattern: &str, model: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == model;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !model.starts_with(first) || !model[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &model[first.len()..model.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The counter keys of a moment (UTC) and when each period ends.
struct Periods {
    day: String,
    month: String,
    minute: String,
    day_reset: String,
    month_reset: String,
    minute_reset: String,
}

impl Periods {
    fn at(now_ms: i64) -> Periods {
        let days = now_ms.div_euclid(86_400_000);
        let (y, m, d) = civil(days);
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        let (ty, tm, td) = civil(days + 1);
        let minute = now_ms.div_euclid(60_000);
        let minute_of_day = minute.rem_euclid(1440) + 1;
        Periods {
            day: format!("day:{y:04}-{m:02}-{d:02}"),
            month: format!("month:{y:04}-{m:02}"),
            minute: format!("minute:{minute}"),
            day_reset: format!("{ty:04}-{tm:02}-{td:02} 00:00 UTC"),
            month_reset: format!("{ny:04}-{nm:02}-01 00:00 UTC"),
            minute_reset: if minute_of_day == 1440 {
                format!("{ty:04}-{tm:02}-{td:02} 00:00 UTC")
            } else {
                format!(
                    "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
                    minute_of_day / 60,
                    minute_of_day % 60
                )
            },
        }
    }

    fn keys(&self) -> [String; 3] {
        [self.day.clone(), self.month.clone(), self.minute.clone()]
    }
}

/// Year, month, day of a count of days since 1970-01-01 (Howard Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_name_the_utc_day_and_month_and_when_they_reset() {
        // 2026-12-31 23:59:30 UTC.
        let p = Periods::at(1_798_761_570_000);
        assert_eq!(p.day, "day:2026-12-31");
        assert_eq!(p.month, "month:2026-12");
        assert_eq!(p.day_reset, "2027-01-01 00:00 UTC");
        assert_eq!(p.month_reset, "2027-01-01 00:00 UTC");
        assert_eq!(p.minute_reset, "2027-01-01 00:00 UTC");
        let p = Periods::at(0);
        assert_eq!(p.day, "day:1970-01-01");
        assert_eq!(p.minute_reset, "1970-01-01 00:01 UTC");
    }

    #[test]
    fn a_second_call_starts_only_while_every_call_in_flight_fits_the_shared_headroom() {
        // The first call on a node always starts, even at the limit's edge.
        assert!(fits_beside(0, 60, 59, None, 2));
        // No call charged yet: a second waits for the first.
        assert!(!fits_beside(1, 60, 0, None, 1));
        // Two calls of 12 on each of 2 nodes need 48 of the headroom.
        assert!(fits_beside(1, 60, 12, Some(12), 2));
        assert!(!fits_beside(1, 60, 13, Some(12), 2));
        assert!(!fits_beside(2, 60, 0, Some(12), 2));
        // Huge figures do not overflow.
        assert!(!fits_beside(
            u32::MAX,
            i64::MAX,
            0,
            Some(i64::MAX),
            usize::MAX
        ));
    }

    #[test]
    fn model_patterns_match_with_wildcards() {
        assert!(matches("*", "gpt-5"));
        assert!(matches("claude-*", "claude-sonnet-4"));
        assert!(matches("*-mini", "gpt-5-mini"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("claude-*", "gpt-5"));
        assert!(!matches("gpt-5", "gpt-5-mini"));
    }
}
