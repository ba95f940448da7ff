//! Services' TLS certificates: uploaded by the customer (checked: PEM,
//! chain order, key match, the service's hostname, validity now) or issued
//! by the operator's internal CA when none is uploaded, and re-issued
//! before they run out. Each is kept in the store with its key (a document
//! of kind `certificate`, id the service's), pushed to the service's caches
//! through their admin API (`PUT /tls/certificates/{hostname}`), and never
//! shown: the API returns what a certificate says about itself, not its key.
//!
//! A background loop keeps the caches in line with the store (an instance
//! started, healed or scaled out gets the certificate at its first check),
//! renews internal-CA certificates with under 30 days left, records an event
//! once a day for a certificate with under 14 days left, and drops the
//! certificate of a service that ended.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use vcdn_http::tls::{self, CertError, CertInfo};

use crate::control::{now_s, Control, ControlError};
use crate::types::{InstanceState, Role, Service};

/// What the store's certificate documents are called.
pub const KIND: &str = "certificate";
/// Internal-CA certificates are issued for this many days...
pub const ISSUE_DAYS: u32 = 90;
/// ...and issued again when fewer than this many seconds are left.
pub const RENEW_BEFORE_S: i64 = 30 * 86_400;
/// A certificate with fewer seconds left than this is reported.
pub const WARN_BEFORE_S: i64 = 14 * 86_400;
/// At most one expiry event per certificate in this many seconds.
pub const WARN_EVERY_S: i64 = 86_400;
/// A push that failed is tried again after this.
const PUSH_RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Uploaded by the customer (or the operator).
    Uploaded,
    /// Issued by the operator's internal CA.
    InternalCa,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Uploaded => "uploaded",
            Source::InternalCa => "internal-ca",
        }
    }
}

/// A service's certificate as stored (the key included: never returned).
#[derive(Clone, Serialize, Deserialize)]
pub struct ServiceCert {
    pub service: String,
    pub hostname: String,
    pub source: Source,
    pub cert_pem: String,
    pub key_pem: String,
    pub names: Vec<String>,
    pub not_before: i64,
    pub not_after: i64,
    pub fingerprint: String,
    pub issuer: String,
    pub updated_at: u64,
    /// When the last expiry event was recorded (Unix seconds).
    #[serde(default)]
    pub warned_at: Option<i64>,
}

impl std::fmt::Debug for ServiceCert {
    /// Without the key: a certificate may end up in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCert")
            .field("service", &self.service)
            .field("source", &self.source)
            .field("names", &self.names)
            .field("not_after", &self.not_after)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl ServiceCert {
    fn new(s: &Service, source: Source, cert_pem: String, key_pem: String, info: CertInfo) -> Self {
        ServiceCert {
            service: s.id.clone(),
            hostname: hostname(s),
            source,
            cert_pem,
            key_pem,
            names: info.names,
            not_before: info.not_before,
            not_after: info.not_after,
            fingerprint: info.fingerprint,
            issuer: info.issuer,
            updated_at: now_s(),
            warned_at: None,
        }
    }

    /// What the API shows: never the key.
    pub fn view(&self) -> Value {
        json!({
            "source": self.source.as_str(),
            "hostname": self.hostname,
            "names": self.names,
            "not_before": tls::rfc3339(self.not_before),
            "not_after": tls::rfc3339(self.not_after),
            "fingerprint": self.fingerprint,
            "issuer": self.issuer,
        })
    }
}

/// The name a service's certificate must cover and is pushed under.
pub fn hostname(s: &Service) -> String {
    s.spec.hostname.trim_end_matches('.').to_ascii_lowercase()
}

/// Checks an upload for `host` at `now`: PEM, chain, key, name, dates.
pub fn check_upload(
    host: &str,
    cert_pem: &str,
    key_pem: &str,
    now: i64,
) -> Result<CertInfo, CertError> {
    let b = tls::parse_bundle(cert_pem.as_bytes(), key_pem.as_bytes())?;
    if !b.info.covers(host) {
        return Err(CertError::WrongName(
            host.to_string(),
            if b.info.names.is_empty() {
                "no name".into()
            } else {
                b.info.names.join(", ")
            },
        ));
    }
    b.info.check_validity(now)?;
    Ok(b.info)
}

/// What the loop does about a certificate at `now`.
#[derive(Debug, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// Issue a new internal-CA certificate.
    Renew,
    /// Record an expiry event (and when it expires, in seconds from now).
    Warn(i64),
}

pub fn due(c: &ServiceCert, now: i64) -> Due {
    let left = c.not_after - now;
    if c.source == Source::InternalCa && left < RENEW_BEFORE_S {
        return Due::Renew;
    }
    if left < WARN_BEFORE_S && c.warned_at.is_none_or(|w| now - w >= WARN_EVERY_S) {
        return Due::Warn(left);
    }
    Due::Nothing
}

/// Which certificate each cache instance was given (instance id → (pid,
/// fingerprint)), and failed pushes by when to try again.
#[derive(Default)]
pub(crate) struct Pushed {
    ok: HashMap<String, (Option<u32>, String)>,
    retry_at: HashMap<String, Instant>,
    /// Ended services whose certificate is gone from the store.
    dropped: std::collections::HashSet<String>,
}

impl Control {
    pub async fn certificate(&self, service: &str) -> Result<Option<ServiceCert>, ControlError> {
        Ok(self.store.get(KIND, service).await?)
    }

    /// A customer's (or the operator's) upload for a service.
    pub async fn put_certificate(
        &self,
        key: &str,
        customer: Option<&str>,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Result<ServiceCert, CertError>, ControlError> {
        let s = self.live_service(key, customer).await?;
        let writing = self.cert_writes.lock().await;
        let info = match check_upload(&hostname(&s), cert_pem, key_pem, now_s() as i64) {
            Ok(i) => i,
            Err(e) => return Ok(Err(e)),
        };
        let c = ServiceCert::new(
            &s,
            Source::Uploaded,
            cert_pem.to_string(),
            key_pem.to_string(),
            info,
        );
        self.store.put(KIND, &s.id, &c).await?;
        drop(writing);
        self.event(
            &s.id,
            "certificate",
            &format!(
                "uploaded certificate {} for {} (until {})",
                c.fingerprint,
                c.names.join(", "),
                tls::rfc3339(c.not_after)
            ),
        )
        .await;
        self.push_now(&s, &c).await;
        Ok(Ok(c))
    }

    /// Drops an uploaded certificate: the internal CA issues one again.
    pub async fn delete_certificate(
        &self,
        key: &str,
        customer: Option<&str>,
    ) -> Result<ServiceCert, ControlError> {
        let s = self.live_service(key, customer).await?;
        let c = {
            let _writing = self.cert_writes.lock().await;
            self.issue(&s).await?
        };
        self.push_now(&s, &c).await;
        Ok(c)
    }

    async fn live_service(
        &self,
        key: &str,
        customer: Option<&str>,
    ) -> Result<Service, ControlError> {
        let s = self.find(key, customer).await?;
        if !s.state.live() || s.state == crate::types::ServiceState::Deleting {
            return Err(ControlError::Conflict(
                format!("service {} is {:?}: it has no certificate", s.id, s.state).to_lowercase(),
            ));
        }
        Ok(s)
    }

    /// Issues (and stores) an internal-CA certificate for a service.
    pub async fn issue(&self, s: &Service) -> Result<ServiceCert, ControlError> {
        let ca =
            self.cfg.internal_ca.as_ref().ok_or_else(|| {
                ControlError::Invalid("this control plane has no internal CA".into())
            })?;
        let names: Vec<String> = crate::accel::names(s).collect();
        let made = ca
            .ca
            .issue(&names, ISSUE_DAYS)
            .map_err(|e| ControlError::Invalid(format!("the internal CA cannot issue: {e}")))?;
        let b = tls::parse_bundle(made.cert_pem.as_bytes(), made.key_pem.as_bytes())
            .map_err(|e| ControlError::Invalid(format!("the internal CA issued garbage: {e}")))?;
        let c = ServiceCert::new(s, Source::InternalCa, made.cert_pem, made.key_pem, b.info);
        self.store.put(KIND, &s.id, &c).await?;
        self.event(
            &s.id,
            "certificate",
            &format!(
                "internal CA issued certificate {} for {} (until {})",
                c.fingerprint,
                names.join(", "),
                tls::rfc3339(c.not_after)
            ),
        )
        .await;
        Ok(c)
    }

    /// The service's certificate, issued by the internal CA if it has none.
    pub async fn ensure_certificate(&self, s: &Service) -> Option<ServiceCert> {
        let _writing = self.cert_writes.lock().await;
        self.ensure_locked(s).await
    }

    /// [`Control::ensure_certificate`] with `cert_writes` held.
    async fn ensure_locked(&self, s: &Service) -> Option<ServiceCert> {
        match self.certificate(&s.id).await {
            Ok(Some(c)) => Some(c),
            Ok(None) if self.cfg.internal_ca.is_some() => match self.issue(s).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(service = %s.id, error = %e, "cannot issue a certificate");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(service = %s.id, error = %e, "cannot read the certificate");
                None
            }
        }
    }

    /// Pushes a changed certificate to every running cache of the service
    /// (if caches serve HTTPS: a key goes only where it is used).
    async fn push_now(&self, s: &Service, c: &ServiceCert) {
        if self.cfg.instance_tls_port.is_none() {
            return;
        }
        let targets: Vec<crate::types::Instance> = s
            .graph
            .instances()
            .filter(|i| i.role == Role::Cache)
            .cloned()
            .collect();
        for i in targets {
            let (id, pid) = (i.id.clone(), i.pid);
            let ok = self.push(&i, c).await;
            let mut p = self.pushed.lock();
            match ok {
                Ok(()) => {
                    p.ok.insert(id.clone(), (pid, c.fingerprint.clone()));
                    p.retry_at.remove(&id);
                }
                Err(_) => {
                    p.ok.remove(&id);
                }
            }
        }
    }

    /// `PUT /tls/certificates/{hostname}` on one cache's admin API.
    async fn push(&self, i: &crate::types::Instance, c: &ServiceCert) -> Result<(), String> {
        let admin = &i.admin;
        // A private key goes in clear only to a loopback address (an
        // instance recorded before admin APIs had TLS).
        if !i.admin_https
            && !admin
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback())
        {
            return Err(format!(
                "instance {}: its admin API {admin} is plain HTTP off loopback: a private key is not sent in clear (it gets an HTTPS admin API when it is restarted)",
                i.id
            ));
        }
        let body = json!({"cert_pem": c.cert_pem, "key_pem": c.key_pem}).to_string();
        let auth = format!("Bearer {}", self.instance_token);
        let r = crate::deployer::instance_request(
            &self.admin,
            i,
            "PUT",
            &format!("/tls/certificates/{}", c.hostname),
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
            Duration::from_secs(5),
        )
        .await?;
        if r.status() == 200 {
            Ok(())
        } else {
            Err(format!(
                "{admin} answered {}: {}",
                r.status(),
                r.text().chars().take(300).collect::<String>()
            ))
        }
    }

    /// One round of the loop: every live service has a certificate, due
    /// renewals and warnings are done, every running cache has the current
    /// one; ended services' certificates are dropped.
    pub async fn certificates_round(&self) {
        let now = now_s() as i64;
        for s in self.list_services(None).await {
            if !s.state.live() {
                if self.pushed.lock().dropped.contains(&s.id) {
                    continue;
                }
                let _writing = self.cert_writes.lock().await;
                match self.store.delete(KIND, &s.id).await {
                    Ok(gone) => {
                        if gone {
                            tracing::info!(service = %s.id, "certificate of an ended service dropped");
                        }
                        self.pushed.lock().dropped.insert(s.id.clone());
                    }
                    Err(e) => {
                        tracing::warn!(service = %s.id, error = %e, "cannot drop the certificate")
                    }
                }
                continue;
            }
            // Read, renew or mark warned, and write back, with no upload
            // in between (it would be overwritten).
            let writing = self.cert_writes.lock().await;
            let Some(mut c) = self.ensure_locked(&s).await else {
                continue;
            };
            match due(&c, now) {
                Due::Nothing => {}
                Due::Renew => match self.issue(&s).await {
                    Ok(n) => c = n,
                    Err(e) => {
                        tracing::error!(service = %s.id, error = %e, "cannot renew the certificate")
                    }
                },
                Due::Warn(left) => {
                    let when = if left < 0 {
                        format!("expired on {}", tls::rfc3339(c.not_after))
                    } else {
                        format!(
                            "expires on {} (in {} days)",
                            tls::rfc3339(c.not_after),
                            left / 86_400
                        )
                    };
                    self.event(
                        &s.id,
                        "certificate_expiring",
                        &format!(
                            "the {} certificate {} for {} {when}; upload a new one (PUT /v1/services/{}/certificate)",
                            c.source.as_str(),
                            c.fingerprint,
                            c.hostname,
                            s.id
                        ),
                    )
                    .await;
                    c.warned_at = Some(now);
                    if let Err(e) = self.store.put(KIND, &s.id, &c).await {
                        tracing::warn!(service = %s.id, error = %e, "cannot store the certificate");
                    }
                }
            }
            drop(writing);
            if self.cfg.instance_tls_port.is_none() {
                continue;
            }
            if !matches!(
                s.state,
                crate::types::ServiceState::Active | crate::types::ServiceState::Degraded
            ) {
                continue;
            }
            for i in s.graph.instances() {
                if i.role != Role::Cache || i.state != InstanceState::Running {
                    continue;
                }
                let want = (i.pid, c.fingerprint.clone());
                {
                    let p = self.pushed.lock();
                    if p.ok.get(&i.id) == Some(&want)
                        || p.retry_at.get(&i.id).is_some_and(|t| Instant::now() < *t)
                    {
                        continue;
                    }
                }
                let r = self.push(i, &c).await;
                let mut p = self.pushed.lock();
                match r {
                    Ok(()) => {
                        tracing::info!(service = %s.id, instance = %i.id, fingerprint = %c.fingerprint, "certificate pushed");
                        p.ok.insert(i.id.clone(), want);
                        p.retry_at.remove(&i.id);
                    }
                    Err(e) => {
                        tracing::warn!(service = %s.id, instance = %i.id, error = %e, "cannot push the certificate; trying again later");
                        p.retry_at.insert(i.id.clone(), Instant::now() + PUSH_RETRY);
                    }
                }
            }
        }
    }

    /// Every stored certificate (for /metrics).
    pub async fn certificates(&self) -> Vec<ServiceCert> {
        self.store.list(KIND).await.unwrap_or_default()
    }
}

/// Runs [`Control::certificates_round`] every second.
pub async fn run(control: Arc<Control>) {
    loop {
        control.certificates_round().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> i64 {
        now_s() as i64
    }

    fn cert(source: Source, left_s: i64, warned_at: Option<i64>) -> ServiceCert {
        ServiceCert {
            service: "s-1".into(),
            hostname: "a.example".into(),
            source,
            cert_pem: String::new(),
            key_pem: "SECRET KEY".into(),
            names: vec!["a.example".into()],
            not_before: 0,
            not_after: now() + left_s,
            fingerprint: "sha256:00".into(),
            issuer: "CN=x".into(),
            updated_at: 0,
            warned_at,
        }
    }

    #[test]
    fn internal_certificates_renew_and_uploaded_ones_warn_once_a_day() {
        let t = now();
        assert_eq!(
            due(&cert(Source::InternalCa, 60 * 86_400, None), t),
            Due::Nothing
        );
        assert_eq!(
            due(&cert(Source::InternalCa, 29 * 86_400, None), t),
            Due::Renew
        );
        assert_eq!(
            due(&cert(Source::Uploaded, 29 * 86_400, None), t),
            Due::Nothing
        );
        assert!(matches!(
            due(&cert(Source::Uploaded, 13 * 86_400, None), t),
            Due::Warn(_)
        ));
        assert_eq!(
            due(&cert(Source::Uploaded, 13 * 86_400, Some(t - 3600)), t),
            Due::Nothing
        );
        assert!(matches!(
            due(&cert(Source::Uploaded, 13 * 86_400, Some(t - 86_400)), t),
            Due::Warn(_)
        ));
        assert!(matches!(due(&cert(Source::Uploaded, -5, None), t), Due::Warn(l) if l < 0));
    }

    #[test]
    fn the_key_is_in_no_view_and_no_debug_output() {
        let c = cert(Source::Uploaded, 100, None);
        assert!(!format!("{c:?}").contains("SECRET"));
        assert!(!c.view().to_string().contains("SECRET"));
        assert_eq!(c.view()["source"], "uploaded");
    }

    #[test]
    fn uploads_are_checked_for_the_name_and_the_dates() {
        let ca = tls::Ca::create("test", 10).unwrap();
        let good = ca.issue(&["a.example".into()], 10).unwrap();
        let info = check_upload("A.example", &good.cert_pem, &good.key_pem, now()).unwrap();
        assert!(info.names.contains(&"a.example".to_string()));
        let e = check_upload("b.example", &good.cert_pem, &good.key_pem, now()).unwrap_err();
        assert!(e.to_string().contains("does not cover b.example"), "{e}");
        let wild = ca.issue(&["*.example".into()], 10).unwrap();
        check_upload("b.example", &wild.cert_pem, &wild.key_pem, now()).unwrap();
        let e = check_upload(
            "a.example",
            &good.cert_pem,
            &good.key_pem,
            now() + 20 * 86_400,
        )
        .unwrap_err();
        assert!(matches!(e, CertError::Expired(_)), "{e}");
    }
}
