//! Taking an order: the checks before planning (fields, lease limits, the
//! origin against the service's origin policy) and the customer's quota,
//! which is checked under the services lock together with the plan so that
//! racing orders cannot both pass it.

use crate::control::{Control, ControlError};
use crate::origin;
use crate::settings::{CustomerSettings, Quota, Settings};
use crate::types::*;
use crate::validate;

/// The store document holding the operator's settings.
const SETTINGS: (&str, &str) = ("settings", "operator");

/// An order that passed every check that does not need the lock.
pub(crate) struct Admitted {
    pub spec: ServiceSpec,
    pub start: u64,
    pub end: u64,
    /// The service's origin policy, in text form, for its caches.
    pub origin_policy: String,
    pub quota: Quota,
}

impl Control {
    /// The operator's settings (the embedded defaults until changed).
    pub async fn settings(&self) -> Result<Settings, ControlError> {
        let (kind, id) = SETTINGS;
        Ok(match self.store.get(kind, id).await? {
            Some(s) => s,
            None => crate::defaults::Defaults::embedded().settings,
        })
    }

    /// Replaces the operator's settings after checking them.
    pub async fn put_settings(&self, s: &Settings) -> Result<(), ControlError> {
        let errors = s.check();
        if !errors.is_empty() {
            return Err(ControlError::Fields(errors));
        }
        let (kind, id) = SETTINGS;
        Ok(self.store.put(kind, id, s).await?)
    }

    /// A customer's own settings.
    pub async fn customer_settings(&self, id: &str) -> Result<CustomerSettings, ControlError> {
        let cu = self.customer(id).await?;
        Ok(CustomerSettings {
            origin_allow: cu.origin_allow,
            quota: cu.quota,
        })
    }

    /// Replaces a customer's own settings after checking them.
    pub async fn put_customer_settings(
        &self,
        id: &str,
        s: CustomerSettings,
    ) -> Result<(), ControlError> {
        let errors = crate::settings::check_origin_allow("origin_allow", &s.origin_allow);
        if !errors.is_empty() {
            return Err(ControlError::Fields(errors));
        }
        let mut cu = self.customer(id).await?;
        cu.origin_allow = s.origin_allow;
        cu.quota = s.quota;
        Ok(self.store.put("customer", id, &cu).await?)
    }

    async fn customer(&self, id: &str) -> Result<Customer, ControlError> {
        self.store
            .get("customer", id)
            .await?
            .ok_or_else(|| ControlError::NotFound(format!("no customer {id}")))
    }

    /// The platform's own addresses as of now.
    pub async fn platform_addresses(&self) -> Result<Vec<origin::PlatformAddress>, ControlError> {
        Ok(origin::platform(
            &self.cfg.platform_listeners,
            &self.regions().await?,
        ))
    }

    /// The origin policy a service of `customer` and `flavor` gets now.
    async fn policy_for(&self, customer: &str, flavor: &str) -> Result<String, ControlError> {
        let settings = self.settings().await?;
        let cu = self.customer(customer).await?;
        let flavor_allow = self
            .flavors()
            .await?
            .into_iter()
            .find(|f| f.name == flavor)
            .map(|f| f.origin_allow)
            .unwrap_or_default();
        let platform = self.platform_addresses().await?;
        origin::service_policy(&settings, &flavor_allow, &cu.origin_allow, &platform)
            .map(|p| p.to_string())
            .map_err(ControlError::Invalid)
    }

    /// Services ordered before origin policies existed get one at start,
    /// from the operator's settings as they are, so that every cache
    /// started for them from now on enforces it. Caches adopted while they
    /// run keep none until they are relaunched: the log says which.
    pub(crate) async fn backfill_origin_policies(&self) {
        let missing: Vec<(String, String, String)> = {
            let services = self.services.lock().await;
            services
                .values()
                .filter(|s| s.origin_policy.is_empty() && s.state.live())
                .map(|s| (s.id.clone(), s.customer.clone(), s.spec.flavor.clone()))
                .collect()
        };
        for (id, customer, flavor) in missing {
            let policy = match self.policy_for(&customer, &flavor).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(service = %id, error = %e, "cannot give the service an origin policy");
                    continue;
                }
            };
            let updated = {
                let mut services = self.services.lock().await;
                services.get_mut(&id).map(|s| {
                    s.origin_policy = policy;
                    s.clone()
                })
            };
            if let Some(s) = updated {
                self.persist(&s).await;
                tracing::warn!(
                    service = %id,
                    "service ordered before origin policies: its caches enforce the operator's \
                     policy from their next start; running ones enforce none until relaunched"
                );
            }
        }
    }

    /// Every check of an order that needs no lock: its fields, its lease
    /// against the operator's limits, its origin against the policy the
    /// service would get (every address the name resolves to).
    pub(crate) async fn admit(
        &self,
        customer: &str,
        spec: ServiceSpec,
        now: u64,
    ) -> Result<Admitted, ControlError> {
        let settings = self.settings().await?;
        let checked = validate::order(spec, &settings.lease, now).map_err(ControlError::Fields)?;
        let cu = self.customer(customer).await?;
        let flavor_allow = self
            .flavors()
            .await?
            .into_iter()
            .find(|f| f.name == checked.spec.flavor)
            .map(|f| f.origin_allow)
            .unwrap_or_default();
        let platform = self.platform_addresses().await?;
        let policy = origin::service_policy(&settings, &flavor_allow, &cu.origin_allow, &platform)
            .map_err(|e| ControlError::Invalid(format!("origin policy: {e}; tell the operator")))?;
        origin::check(&checked.origin, &policy, &platform)
            .await
            .map_err(|e| ControlError::Fields(vec![FieldError::new("origin", e)]))?;
        Ok(Admitted {
            spec: checked.spec,
            start: checked.start,
            end: checked.end,
            origin_policy: policy.to_string(),
            quota: cu.quota.unwrap_or(settings.quota),
        })
    }
}

/// Whether `customer` may add a service of `vcpus` to what its live and
/// scheduled `services` hold.
pub(crate) fn check_quota<'a>(
    quota: &Quota,
    customer: &str,
    services: impl Iterator<Item = &'a Service>,
    vcpus: u32,
) -> Result<(), ControlError> {
    let mine: Vec<&Service> = services
        .filter(|s| s.customer == customer && s.state.live())
        .collect();
    let ask = "; delete one or ask the operator to raise your quota";
    if mine.len() >= quota.max_services as usize {
        return Err(ControlError::Conflict(format!(
            "quota: you may hold at most {} service{} at once and hold {}{ask}",
            quota.max_services,
            if quota.max_services == 1 { "" } else { "s" },
            mine.len(),
        )));
    }
    let held: u64 = mine
        .iter()
        .flat_map(|s| s.graph.instances())
        .map(|i| u64::from(i.vcpus))
        .sum();
    if held + u64::from(vcpus) > u64::from(quota.max_vcpus) {
        return Err(ControlError::Conflict(format!(
            "quota: this order reserves {vcpus} vCPUs and you hold {held} of at most {} vCPUs{ask}",
            quota.max_vcpus
        )));
    }
    Ok(())
}
