//! `[auth]`, `[[teams]]` and `[[users]]`: how a request is tied to a person (trusted header,
//! Cursor account or issued tokens), who is an admin, and each team's and person's limits.
//! Absent `[auth]`, the server is single-user exactly as before (and teams/users are refused, as
//! they would mean nothing).
//!
//! A file of its own: the identity rules (a proxy list in CIDR form, a header name that is a valid
//! header, an e-mail that belongs to at most one team) belong together, and `config/file.rs` stays
//! within 800 lines.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// Default lifetime of a verified Cursor access token in the cache.
pub const DEFAULT_CURSOR_CACHE_SECS: u64 = 300;
/// Default route asked for the account behind a Cursor access token (Connect unary, empty request).
pub const DEFAULT_CURSOR_ME_ROUTE: &str = "/aiserver.v1.DashboardService/GetMe";

/// `[auth]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAuth {
    mode: String,
    header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    domains: Vec<String>,
    cursor_cache_secs: Option<u64>,
    cursor_me_route: Option<String>,
}

/// Limits as written in `[[teams]]` and `[[users]]` (and stored by `users set-budget`).
#[derive(Debug, Default, Clone, PartialEq, Deserialize, serde::Serialize)]
pub struct Limits {
    /// Models one may use (`*` patterns); `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daily_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monthly_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monthly_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_daily_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_monthly_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_daily_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_monthly_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u32>,
}

impl Limits {
    /// `self`'s limits where set, `base`'s elsewhere (a person's overrides over the team's).
    pub fn over(&self, base: &Limits) -> Limits {
        Limits {
            models: self.models.clone().or_else(|| base.models.clone()),
            daily_cost_usd: self.daily_cost_usd.or(base.daily_cost_usd),
            monthly_cost_usd: self.monthly_cost_usd.or(base.monthly_cost_usd),
            daily_tokens: self.daily_tokens.or(base.daily_tokens),
            monthly_tokens: self.monthly_tokens.or(base.monthly_tokens),
            soft_daily_cost_usd: self.soft_daily_cost_usd.or(base.soft_daily_cost_usd),
            soft_monthly_cost_usd: self.soft_monthly_cost_usd.or(base.soft_monthly_cost_usd),
            soft_daily_tokens: self.soft_daily_tokens.or(base.soft_daily_tokens),
            soft_monthly_tokens: self.soft_monthly_tokens.or(base.soft_monthly_tokens),
            requests_per_minute: self.requests_per_minute.or(base.requests_per_minute),
            concurrent_runs: self.concurrent_runs.or(base.concurrent_runs),
        }
    }

    /// What is wrong with these limits (negative or non-finite money, zero rates), if anything.
    pub fn problem(&self) -> Option<String> {
        let money = [
            ("daily_cost_usd", self.daily_cost_usd),
            ("monthly_cost_usd", self.monthly_cost_usd),
            ("soft_daily_cost_usd", self.soft_daily_cost_usd),
            ("soft_monthly_cost_usd", self.soft_monthly_cost_usd),
        ];
        if let Some((name, value)) = money
            .iter()
            .find(|(_, v)| v.is_some_and(|v| !(v.is_finite() && v >= 0.0)))
        {
            return Some(format!(
                "{name} = {} must be a number of dollars, 0 or more",
                value.unwrap_or_default()
            ));
        }
        if self.requests_per_minute == Some(0) || self.concurrent_runs == Some(0) {
            return Some(
                "requests_per_minute and concurrent_runs must be at least 1 (leave them out for no limit)"
                    .to_owned(),
            );
        }
        None
    }
}

/// `[[teams]]` as written. (serde's `deny_unknown_fields` does not work beside `flatten`: what
/// neither the fields nor the limits took is collected in `unknown` and refused.)
#[derive(Debug, Deserialize)]
pub(super) struct FileTeam {
    name: String,
    #[serde(default)]
    members: Vec<String>,
    #[serde(flatten)]
    limits: Limits,
    /// `[teams.total]`: what the whole team may spend together.
    #[serde(default)]
    total: Option<FileTotal>,
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, toml::Value>,
}

/// `[teams.total]` as written: spend limits on the sum of every member's calls (the team's own
/// limits above it apply to each member alone). Only cost and token limits (and their soft
/// variants) apply to a whole team; requests per minute, concurrent runs and models stay per
/// person (refused here, not silently ignored).
#[derive(Debug, Deserialize)]
pub(super) struct FileTotal {
    #[serde(flatten)]
    limits: Limits,
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, toml::Value>,
}

impl FileTotal {
    fn problems(&self, team: &str) -> Vec<ConfigError> {
        let mut problems = unknown_keys(&format!("team {team:?} total"), &self.unknown);
        let per_person = [
            ("models", self.limits.models.is_some()),
            (
                "requests_per_minute",
                self.limits.requests_per_minute.is_some(),
            ),
            ("concurrent_runs", self.limits.concurrent_runs.is_some()),
        ];
        for (key, set) in per_person {
            if set {
                problems.push(ConfigError::Auth(format!(
                    "team {team:?} total: {key} is per person; set it beside the team's other limits, not in [teams.total]"
                )));
            }
        }
        problems
    }
}

/// `[[users]]` as written (unknown keys refused as in `FileTeam`).
#[derive(Debug, Deserialize)]
pub(super) struct FileUser {
    email: String,
    #[serde(flatten)]
    limits: Limits,
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, toml::Value>,
}

/// A problem for each key `owner` does not know.
fn unknown_keys(
    owner: &str,
    unknown: &std::collections::BTreeMap<String, toml::Value>,
) -> Vec<ConfigError> {
    unknown
        .keys()
        .map(|key| ConfigError::Auth(format!("{owner}: unknown key {key:?}")))
        .collect()
}

/// How a request is tied to a person.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthMode {
    /// A fronting proxy names the person in `header`; believed only from `trusted_proxies`.
    TrustedHeader {
        header: axum::http::HeaderName,
        trusted_proxies: Vec<Cidr>,
    },
    /// The person's own Cursor sign-in, verified against Cursor's backend at `me_route`.
    CursorAccount { cache: Duration, me_route: String },
    /// Tokens the admin issued (`cursor-server users add`).
    Tokens,
}

impl AuthMode {
    pub fn name(&self) -> &'static str {
        match self {
            AuthMode::TrustedHeader { .. } => "trusted_header",
            AuthMode::CursorAccount { .. } => "cursor_account",
            AuthMode::Tokens => "tokens",
        }
    }
}

/// The validated `[auth]`, `[[teams]]` and `[[users]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// E-mails (lower case) of the people who see everyone's data and manage the others.
    pub admins: Vec<String>,
    /// E-mail domains whose people are let in without being listed (cursor_account,
    /// trusted_header); empty: only listed people (teams' members, users, admins).
    pub domains: Vec<String>,
    pub teams: Vec<TeamConfig>,
    pub users: Vec<UserConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TeamConfig {
    pub name: String,
    pub members: Vec<String>,
    /// Each member's limits (unless the member has their own).
    pub limits: Limits,
    /// The whole team's spend limits (`[teams.total]`: cost and tokens only).
    pub total: Option<Limits>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UserConfig {
    pub email: String,
    pub limits: Limits,
}

impl AuthConfig {
    /// The team named `name` in the file, if any.
    pub fn team(&self, name: &str) -> Option<&TeamConfig> {
        self.teams.iter().find(|t| t.name == name)
    }

    /// A stored person's own limits and the limits in force for them (their own over their
    /// team's): what the budget check enforces and the people page shows.
    pub fn limits_of(&self, team: Option<&str>, own: Option<&str>) -> (Limits, Limits) {
        let own: Limits = own
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default();
        let team_limits = team
            .and_then(|name| self.team(name))
            .map(|t| t.limits.clone())
            .unwrap_or_default();
        let in_force = own.over(&team_limits);
        (own, in_force)
    }

    /// The team `email` belongs to in the file, if any.
    pub fn team_of(&self, email: &str) -> Option<&TeamConfig> {
        self.teams
            .iter()
            .find(|t| t.members.iter().any(|m| m == email))
    }

    /// Whether `email` may come in without an account made by an admin: listed somewhere in
    /// the file, or of an allowed domain.
    pub fn admits(&self, email: &str) -> bool {
        self.admins.iter().any(|a| a == email)
            || self.users.iter().any(|u| u.email == email)
            || self.team_of(email).is_some()
            || email
                .rsplit_once('@')
                .is_some_and(|(_, domain)| self.domains.iter().any(|d| d == domain))
    }
}

/// An IP network `a.b.c.d/n` or `x::y/n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr.parse::<IpAddr>().ok()?, prefix.parse::<u8>().ok()?),
            None => {
                let addr = text.parse::<IpAddr>().ok()?;
                (addr, if addr.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An e-mail as the server keys people: trimmed, lower case; `None` when it is not one.
pub fn normalize_email(email: &str) -> Option<String> {
    let email = email.trim().to_ascii_lowercase();
    let (local, domain) = email.split_once('@')?;
    (!local.is_empty() && domain.contains('.') && !email.contains(char::is_whitespace))
        .then_some(email)
}

impl FileAuth {
    pub(super) fn validate(
        self,
        teams: Vec<FileTeam>,
        users: Vec<FileUser>,
    ) -> Result<AuthConfig, Vec<ConfigError>> {
        let mut problems = Vec::new();
        let mut problem = |message: String| problems.push(ConfigError::Auth(message));
        let mode = match self.mode.as_str() {
            "trusted_header" => {
                let header = self.header.as_deref().unwrap_or("");
                let parsed = axum::http::HeaderName::from_bytes(header.trim().as_bytes());
                let proxies: Vec<Option<Cidr>> = self
                    .trusted_proxies
                    .iter()
                    .map(|p| Cidr::parse(p))
                    .collect();
                for (text, parsed) in self.trusted_proxies.iter().zip(&proxies) {
                    if parsed.is_none() {
                        problem(format!(
                            "trusted_proxies: {text:?} is not an address or network (like 10.0.0.0/8 or 127.0.0.1/32)"
                        ));
                    }
                }
                if self.trusted_proxies.is_empty() {
                    problem("mode = \"trusted_header\" needs trusted_proxies: the addresses of the proxy that sets the header (like [\"127.0.0.1/32\"])".to_owned());
                }
                match parsed {
                    Ok(header) if !header.as_str().is_empty() => AuthMode::TrustedHeader {
                        header,
                        trusted_proxies: proxies.into_iter().flatten().collect(),
                    },
                    _ => {
                        problem(format!(
                            "mode = \"trusted_header\" needs header = the header the proxy names the user in (like \"X-Forwarded-Email\"); {header:?} is not a header name"
                        ));
                        AuthMode::Tokens
                    }
                }
            }
            "cursor_account" => {
                let secs = self.cursor_cache_secs.unwrap_or(DEFAULT_CURSOR_CACHE_SECS);
                if secs == 0 {
                    problem("cursor_cache_secs must be greater than zero".to_owned());
                }
                let me_route = self
                    .cursor_me_route
                    .unwrap_or_else(|| DEFAULT_CURSOR_ME_ROUTE.to_owned());
                if !me_route.starts_with('/') {
                    problem(format!(
                        "cursor_me_route {me_route:?} must be a path starting with '/'"
                    ));
                }
                AuthMode::CursorAccount {
                    cache: Duration::from_secs(secs.max(1)),
                    me_route,
                }
            }
            "tokens" => AuthMode::Tokens,
            other => {
                problem(format!(
                    "mode {other:?} is not one of trusted_header, cursor_account, tokens"
                ));
                AuthMode::Tokens
            }
        };
        if !matches!(mode, AuthMode::TrustedHeader { .. })
            && (self.header.is_some() || !self.trusted_proxies.is_empty())
        {
            problem(format!(
                "header and trusted_proxies apply only to mode = \"trusted_header\", not {:?}",
                self.mode
            ));
        }
        let mut email = |field: &str, text: &str| {
            normalize_email(text).or_else(|| {
                problem(format!("{field}: {text:?} is not an e-mail address"));
                None
            })
        };
        let admins: Vec<String> = self
            .admins
            .iter()
            .filter_map(|a| email("admins", a))
            .collect();
        let mut team_configs: Vec<TeamConfig> = Vec::new();
        let mut unknown = Vec::new();
        for team in &teams {
            unknown.extend(unknown_keys(
                &format!("team {:?}", team.name),
                &team.unknown,
            ));
            if let Some(total) = &team.total {
                unknown.extend(total.problems(&team.name));
            }
        }
        for user in &users {
            unknown.extend(unknown_keys(
                &format!("user {:?}", user.email),
                &user.unknown,
            ));
        }
        for team in teams {
            let members = team
                .members
                .iter()
                .filter_map(|m| email(&format!("team {:?} members", team.name), m))
                .collect();
            team_configs.push(TeamConfig {
                name: team.name.trim().to_owned(),
                members,
                limits: team.limits,
                total: team.total.map(|t| t.limits),
            });
        }
        let user_configs: Vec<UserConfig> = users
            .into_iter()
            .filter_map(|u| {
                Some(UserConfig {
                    email: email("users", &u.email)?,
                    limits: u.limits,
                })
            })
            .collect();
        problems.extend(unknown);
        problems.extend(check_teams(&team_configs, &user_configs));
        let domains = self
            .domains
            .iter()
            .map(|d| d.trim().trim_start_matches('@').to_ascii_lowercase())
            .collect();
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(AuthConfig {
            mode,
            admins,
            domains,
            teams: team_configs,
            users: user_configs,
        })
    }
}

/// `[auth]` with its teams and users; teams or users without `[auth]` are refused (they would
/// silently limit no one).
pub(super) fn validate_section(
    (auth, teams, users): (Option<FileAuth>, Vec<FileTeam>, Vec<FileUser>),
    pass_through: bool,
    problems: &mut Vec<ConfigError>,
) -> Option<AuthConfig> {
    let Some(auth) = auth else {
        if !teams.is_empty() || !users.is_empty() {
            problems.push(ConfigError::Auth(
                "[[teams]] and [[users]] need an [auth] section saying how people are identified (mode = \"tokens\", \"trusted_header\" or \"cursor_account\")".to_owned(),
            ));
        }
        return None;
    };
    match auth.validate(teams, users) {
        Ok(auth) => {
            problems.extend(needs_upstream(&auth, pass_through));
            Some(auth)
        }
        Err(found) => {
            for problem in found {
                problems.push(problem);
            }
            None
        }
    }
}

/// `cursor_account` verifies sign-ins through the pass-through: a problem when it is off.
fn needs_upstream(auth: &AuthConfig, pass_through: bool) -> Option<ConfigError> {
    (matches!(auth.mode, AuthMode::CursorAccount { .. }) && !pass_through).then(|| {
        ConfigError::Auth(
            "mode = \"cursor_account\" verifies sign-ins with Cursor's backend: it needs pass-through on (upstream_url)".to_owned(),
        )
    })
}

/// Names unique and non-empty, a person in at most one team and listed at most once, limits sane.
fn check_teams(teams: &[TeamConfig], users: &[UserConfig]) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    let mut problem = |message: String| problems.push(ConfigError::Auth(message));
    for (i, team) in teams.iter().enumerate() {
        if team.name.is_empty() {
            problem("[[teams]] name must not be empty".to_owned());
        }
        if teams[..i].iter().any(|t| t.name == team.name) {
            problem(format!("[[teams]] {:?} is listed twice", team.name));
        }
        for member in &team.members {
            if let Some(first) = teams[..i].iter().find(|t| t.members.contains(member)) {
                problem(format!(
                    "{member} is a member of both team {:?} and team {:?}; a person's limits come from one team",
                    first.name, team.name
                ));
            }
        }
        if let Some(why) = team.limits.problem() {
            problem(format!("team {:?}: {why}", team.name));
        }
        if let Some(why) = team.total.as_ref().and_then(Limits::problem) {
            problem(format!("team {:?} total: {why}", team.name));
        }
    }
    for (i, user) in users.iter().enumerate() {
        if users[..i].iter().any(|u| u.email == user.email) {
            problem(format!("[[users]] {} is listed twice", user.email));
        }
        if let Some(why) = user.limits.problem() {
            problem(format!("user {}: {why}", user.email));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const PROVIDER: &str = "[[providers]]\nname = \"p\"\nkind = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key = \"k\"\n[[providers.models]]\nid = \"m1\"\n";

    fn parse(top: &str, tables: &str) -> Result<Config, ConfigError> {
        let text = format!("{top}\n{PROVIDER}\n{tables}");
        Config::from_toml(&text, Path::new("test.toml"), &|_| None)
    }

    fn problems(top: &str, tables: &str) -> String {
        parse(top, tables).expect_err("refused").to_string()
    }

    #[test]
    fn the_issues_interface_parses_with_team_and_user_limits() {
        let config = parse(
            "",
            r#"
[auth]
mode = "trusted_header"
header = "X-Forwarded-Email"
trusted_proxies = ["127.0.0.1/32", "10.0.0.0/8", "::1"]
admins = ["Lead@Example.com"]

[[teams]]
name = "platform"
members = ["a@example.com", "b@example.com"]
models = ["*"]
daily_cost_usd = 50.0
monthly_cost_usd = 500.0
requests_per_minute = 60
concurrent_runs = 4

[[users]]
email = "b@example.com"
daily_cost_usd = 0.01
"#,
        )
        .expect("valid");
        let auth = config.auth.expect("[auth]");
        let AuthMode::TrustedHeader {
            header,
            trusted_proxies,
        } = &auth.mode
        else {
            panic!("trusted_header");
        };
        assert_eq!(header.as_str(), "x-forwarded-email");
        assert!(trusted_proxies[1].contains("10.1.2.3".parse().unwrap()));
        assert!(!trusted_proxies[0].contains("127.0.0.2".parse().unwrap()));
        assert!(trusted_proxies[0].contains("::ffff:127.0.0.1".parse().unwrap()));
        assert_eq!(auth.admins, ["lead@example.com"]);
        let team = auth.team_of("b@example.com").expect("team");
        let b = auth.users[0].limits.over(&team.limits);
        assert_eq!(b.daily_cost_usd, Some(0.01));
        assert_eq!(b.monthly_cost_usd, Some(500.0));
        assert_eq!(b.concurrent_runs, Some(4));
        assert!(auth.admits("a@example.com") && !auth.admits("x@example.com"));
    }

    #[test]
    fn a_teams_total_takes_cost_and_token_limits_only() {
        let auth =
            "[auth]\nmode = \"tokens\"\n\n[[teams]]\nname = \"t\"\nmembers = [\"a@example.com\"]\n";
        let config = parse(
            "",
            &format!("{auth}[teams.total]\ndaily_cost_usd = 20.0\nsoft_monthly_tokens = 5\n"),
        )
        .expect("valid");
        let total = config.auth.expect("[auth]").teams[0]
            .total
            .clone()
            .expect("total");
        assert_eq!(total.daily_cost_usd, Some(20.0));
        assert_eq!(total.soft_monthly_tokens, Some(5));
        let message = problems(
            "",
            &format!(
                "{auth}[teams.total]\nrequests_per_minute = 5\ndaily_cost = 1\nmonthly_cost_usd = -1\n"
            ),
        );
        assert!(
            message.contains("team \"t\" total: requests_per_minute is per person"),
            "{message}"
        );
        assert!(
            message.contains("team \"t\" total: unknown key \"daily_cost\""),
            "{message}"
        );
        assert!(message.contains("monthly_cost_usd = -1"), "{message}");
    }

    #[test]
    fn without_auth_nothing_changes_and_teams_alone_are_refused() {
        assert!(parse("", "").expect("valid").auth.is_none());
        let message = problems("", "[[teams]]\nname = \"t\"\n");
        assert!(message.contains("need an [auth] section"), "{message}");
    }

    #[test]
    fn every_auth_problem_is_named_precisely() {
        let message = problems(
            "",
            r#"
[auth]
mode = "trusted_header"
trusted_proxies = ["10.0.0.0/33", "proxy.local"]
admins = ["not-an-email"]

[[teams]]
name = "a"
members = ["x@example.com"]
daily_cost_usd = -1.0
colour = "blue"

[[teams]]
name = "b"
members = ["x@example.com"]
requests_per_minute = 0
"#,
        );
        for expected in [
            "needs header",
            "\"10.0.0.0/33\" is not an address or network",
            "\"proxy.local\" is not an address or network",
            "\"not-an-email\" is not an e-mail address",
            "daily_cost_usd = -1 must be a number of dollars",
            "team \"a\": unknown key \"colour\"",
            "member of both team \"a\" and team \"b\"",
            "requests_per_minute and concurrent_runs must be at least 1",
        ] {
            assert!(
                message.contains(expected),
                "{expected:?} missing from:\n{message}"
            );
        }
        let message = problems("", "[auth]\nmode = \"ldap\"\n");
        assert!(message.contains("\"ldap\" is not one of trusted_header, cursor_account, tokens"));
        let message = problems(
            "pass_through = false",
            "[auth]\nmode = \"cursor_account\"\n",
        );
        assert!(message.contains("needs pass-through on"), "{message}");
        let message = problems("", "[auth]\nmode = \"tokens\"\nheader = \"X-Email\"\n");
        assert!(
            message.contains("apply only to mode = \"trusted_header\""),
            "{message}"
        );
    }
}
