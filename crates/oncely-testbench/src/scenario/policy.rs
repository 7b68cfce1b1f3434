//! A scenario's retry policy and budget, and how a scenario's own merges over the file's.

use serde::{Deserialize, Serialize};

/// A policy: every field optional (unset = the SDK's default); durations in milliseconds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Attempts per logical call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Overall deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Per-attempt timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// Full-jitter base delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<u64>,
    /// Full-jitter cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_ms: Option<u64>,
    /// Retry 500 for requests safe to repeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_500: Option<bool>,
    /// Mint keys for POST and PATCH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mint_keys: Option<bool>,
    /// The budget: absent = inherit, `null` = disabled, an object = overrides key by key.
    #[serde(
        default,
        deserialize_with = "budget_field",
        skip_serializing_if = "BudgetSetting::is_inherit"
    )]
    pub budget: BudgetSetting,
}

/// The `budget` field of a policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum BudgetSetting {
    /// Not set: inherit.
    #[default]
    Inherit,
    /// `null`: no budget.
    Disabled,
    /// Overrides, key by key.
    Set(Budget),
}

impl BudgetSetting {
    fn is_inherit(&self) -> bool {
        *self == Self::Inherit
    }
}

fn budget_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BudgetSetting, D::Error> {
    Ok(match Option::<Budget>::deserialize(d)? {
        None => BudgetSetting::Disabled,
        Some(b) => BudgetSetting::Set(b),
    })
}

/// Budget overrides, in tokens.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Capacity (and initial fill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// Cost of a retry after a transient error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transient_cost: Option<u32>,
    /// Cost of a retry after throttling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle_cost: Option<u32>,
    /// Refund of a first-attempt success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_refund: Option<u32>,
}

impl Budget {
    fn over(self, under: Self) -> Self {
        Self {
            capacity: self.capacity.or(under.capacity),
            transient_cost: self.transient_cost.or(under.transient_cost),
            throttle_cost: self.throttle_cost.or(under.throttle_cost),
            success_refund: self.success_refund.or(under.success_refund),
        }
    }
}

impl Policy {
    /// `self` over `under`, key by key (the merge rule of the README).
    pub fn over(&self, under: &Self) -> Self {
        let budget = match (self.budget, under.budget) {
            (BudgetSetting::Inherit, b) => b,
            (BudgetSetting::Disabled, _) => BudgetSetting::Disabled,
            (BudgetSetting::Set(s), BudgetSetting::Set(u)) => BudgetSetting::Set(s.over(u)),
            (BudgetSetting::Set(s), _) => BudgetSetting::Set(s),
        };
        Self {
            max_attempts: self.max_attempts.or(under.max_attempts),
            deadline_ms: self.deadline_ms.or(under.deadline_ms),
            attempt_timeout_ms: self.attempt_timeout_ms.or(under.attempt_timeout_ms),
            base_ms: self.base_ms.or(under.base_ms),
            cap_ms: self.cap_ms.or(under.cap_ms),
            retry_500: self.retry_500.or(under.retry_500),
            mint_keys: self.mint_keys.or(under.mint_keys),
            budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_merge_key_by_key_and_null_disables_the_budget() {
        let under: Policy =
            serde_json::from_str(r#"{"max_attempts":3,"base_ms":20,"budget":{"capacity":20}}"#)
                .unwrap();
        let over: Policy =
            serde_json::from_str(r#"{"base_ms":5,"budget":{"transient_cost":10}}"#).unwrap();
        let merged = over.over(&under);
        assert_eq!(merged.max_attempts, Some(3));
        assert_eq!(merged.base_ms, Some(5));
        assert_eq!(
            merged.budget,
            BudgetSetting::Set(Budget {
                capacity: Some(20),
                transient_cost: Some(10),
                ..Budget::default()
            })
        );
        let off: Policy = serde_json::from_str(r#"{"budget":null}"#).unwrap();
        assert_eq!(off.over(&under).budget, BudgetSetting::Disabled);
        let none: Policy = serde_json::from_str("{}").unwrap();
        assert_eq!(none.over(&under).budget, under.budget);
    }
}
