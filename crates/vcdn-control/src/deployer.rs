//! The deployer's data-plane wiring (the paper's resource orchestrator
//! beyond the VIM): wait until instances answer, and configure the request
//! router through its admin API so users reach them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use vcdn_http::admin_tls::AdminClient;
use vcdn_http::client::{ClientError, ClientResponse};
use vcdn_router::config::{AccelConfig, CacheEndpoint, ServiceConfig, ServiceRegion, ServiceSrv6};

use crate::types::{Instance, Service, ServiceState};

/// The router's admin API.
#[derive(Debug, Clone)]
pub struct RouterLink {
    pub admin: SocketAddr,
    pub token: String,
    /// HTTPS, trusting these (the internal CA); plain HTTP without.
    pub trust: Option<vcdn_http::tls::Trust>,
}

impl RouterLink {
    async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<vcdn_http::client::ClientResponse, String> {
        let t = Duration::from_secs(2);
        match &self.trust {
            None => vcdn_http::client::request(self.admin, method, path, headers, body, t).await,
            Some(trust) => {
                // A wildcard listener is reached (and named) on loopback.
                let mut a = self.admin;
                if a.ip().is_unspecified() {
                    a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                let url = format!("https://{a}");
                vcdn_http::client::request_url(&url, trust, method, path, headers, body, t).await
            }
        }
        .map_err(|e| format!("router admin API: {e}"))
    }

    async fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<(), String> {
        let auth = format!("Bearer {}", self.token);
        let r = self
            .request(
                method,
                path,
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                body,
            )
            .await?;
        match r.status() {
            200..=299 => Ok(()),
            404 if method == "DELETE" => Ok(()),
            s => Err(format!(
                "router admin API answered {s}: {}",
                r.text().trim()
            )),
        }
    }

    /// Gives the router the service with its current instances.
    pub async fn put(&self, s: &Service) -> Result<(), String> {
        let cfg = router_service(s);
        let body = serde_json::to_vec(&cfg).expect("router config serializes");
        self.call("PUT", &format!("/services/{}", s.id), &body)
            .await
    }

    /// The services the router has now.
    pub async fn list(&self) -> Result<Vec<ServiceConfig>, String> {
        let auth = format!("Bearer {}", self.token);
        let r = self
            .request("GET", "/services", &[("Authorization", &auth)], b"")
            .await?;
        if r.status() != 200 {
            return Err(format!(
                "router admin API answered {}: {}",
                r.status(),
                r.text().trim()
            ));
        }
        #[derive(serde::Deserialize)]
        struct List {
            services: Vec<ServiceConfig>,
        }
        serde_json::from_slice::<List>(&r.body)
            .map(|l| l.services)
            .map_err(|e| format!("router admin API: {e}"))
    }

    pub async fn delete(&self, id: &str) -> Result<(), String> {
        self.call("DELETE", &format!("/services/{id}"), b"").await
    }
}

/// An instance as the router lists it: where users reach it and its admin
/// address (whose `/healthz` the router polls).
fn endpoint(i: &Instance) -> Option<CacheEndpoint> {
    Some(CacheEndpoint {
        address: i.address.parse().ok()?,
        admin: i.admin.parse().ok(),
        admin_https: i.admin_https,
        admin_name: i.admin_name.clone(),
        max_connections: None,
        sid: None,
    })
}

/// A cache of a service routed with SRv6: its agent's SID too.
fn srv6_endpoint(s: &Service, i: &Instance) -> Option<CacheEndpoint> {
    let mut e = endpoint(i)?;
    if s.graph.srv6.is_some() {
        e.sid = Some(vcdn_srv6::domain::Node::of(&i.id).sid);
    }
    Some(e)
}

/// The router's record of a service: per region, its caches with their
/// admin addresses (whose `/healthz` the router polls); for an accelerated
/// service also its acceleration hostname, path prefixes and the ingress
/// proxy of every region (answered and redirected to like caches).
pub fn router_service(s: &Service) -> ServiceConfig {
    let up = s.state != ServiceState::Failed;
    let accel = s.graph.accel.as_ref().map(|a| AccelConfig {
        hostname: a.hostname.clone(),
        paths: s
            .spec
            .acceleration
            .as_ref()
            .map(|x| x.paths.clone())
            .unwrap_or_default(),
        regions: s
            .graph
            .regions
            .iter()
            .map(|r| ServiceRegion {
                region: r.region.clone(),
                caches: s
                    .graph
                    .ingress(&r.region)
                    .filter(|p| up && p.serving())
                    .and_then(endpoint)
                    .into_iter()
                    .collect(),
            })
            .collect(),
    });
    ServiceConfig {
        name: s.id.clone(),
        hostname: s.spec.hostname.trim_end_matches('.').to_ascii_lowercase(),
        origin: s.spec.origin.clone(),
        regions: s
            .graph
            .regions
            .iter()
            .map(|r| ServiceRegion {
                region: r.region.clone(),
                caches: if s.state == ServiceState::Failed {
                    Vec::new()
                } else {
                    r.instances
                        .iter()
                        .filter(|i| i.serving())
                        .filter_map(|i| srv6_endpoint(s, i))
                        .collect()
                },
            })
            .collect(),
        admission: Default::default(),
        template: None,
        accel,
        srv6: s.graph.srv6.as_ref().map(|v| ServiceSrv6 {
            prefix: vcdn_srv6::domain::chunk_prefix(v.number),
            origin_sid: vcdn_srv6::domain::Node::of(&v.gateway.id).sid,
        }),
    }
}

/// The instance identity a `/healthz` or `/stats` answer claims: caches
/// say `instance_id`, proxies `instance` (either is accepted from both).
pub fn claimed_identity(v: &serde_json::Value) -> &str {
    v["instance_id"]
        .as_str()
        .or_else(|| v["instance"].as_str())
        .unwrap_or("")
}

/// One request to an instance's admin API: HTTPS verified against the
/// internal CA when the instance was started with an admin certificate,
/// plain HTTP for one recorded before. A certificate the CA did not issue
/// fails the handshake before the token (or a customer's key) is sent.
#[allow(clippy::too_many_arguments)]
pub async fn instance_request(
    client: &AdminClient,
    i: &Instance,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<ClientResponse, String> {
    let addr: SocketAddr = i
        .admin
        .parse()
        .map_err(|e| format!("instance {}: bad admin address {}: {e}", i.id, i.admin))?;
    client
        .endpoint_named(addr, i.admin_https, i.admin_name.as_deref())
        .request(method, path, headers, body, timeout)
        .await
        .map_err(|e| admin_error(i, addr, &e))
}

/// What a failed admin call means, for logs and events.
fn admin_error(i: &Instance, addr: SocketAddr, e: &ClientError) -> String {
    let url = vcdn_http::admin_tls::url(addr, i.admin_https);
    match e {
        ClientError::Tls(_, m) if e.is_untrusted_certificate() => format!(
            "instance {}: {url}: TLS handshake failed: {m}; the certificate there is not one the internal CA issued (another process may hold the address): nothing was sent",
            i.id
        ),
        e => format!("instance {}: {url}: {e}", i.id),
    }
}

/// Polls each instance's `/healthz` until all answer 200 with their own
/// identity, or says which did not within `limit`. Something else
/// answering on an instance's address is a conflict, said at once: the
/// instance cannot bind it, so waiting would not help. So is an HTTPS
/// admin address whose certificate the internal CA did not issue.
pub async fn wait_ready(
    client: &AdminClient,
    instances: &[Instance],
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let waits = instances.iter().map(|i| async move {
        let (id, admin, identity) = (&i.id, &i.admin, i.identity());
        let addr: SocketAddr = admin
            .parse()
            .map_err(|e| format!("instance {id}: bad admin address {admin}: {e}"))?;
        let url = vcdn_http::admin_tls::url(addr, i.admin_https);
        let mut pause = Duration::from_millis(1);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "instance {id} did not answer on {url}/healthz within {limit:?}"
                ));
            }
            let r = client
                .endpoint_named(addr, i.admin_https, i.admin_name.as_deref())
                .request(
                    "GET",
                    "/healthz",
                    &[],
                    b"",
                    left.min(Duration::from_millis(500)),
                )
                .await;
            match &r {
                Ok(r) if r.status() == 200 => {
                    let v: serde_json::Value =
                        serde_json::from_slice(&r.body).unwrap_or_default();
                    let who = claimed_identity(&v);
                    if who == identity {
                        return Ok(());
                    }
                    return Err(format!(
                        "conflict: another process answers on instance {id}'s address {url}/healthz ({}), so {id} cannot serve there",
                        if who.is_empty() { "with no instance id".to_string() } else { format!("as instance {who}") }
                    ));
                }
                Err(e) if e.is_untrusted_certificate() => {
                    let e = admin_error(i, addr, e);
                    tracing::warn!(instance = %id, error = %e, "admin certificate refused");
                    return Err(format!("conflict: {e}"));
                }
                _ => {}
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    });
    // Instances start in parallel, so waiting for them in turn costs the
    // slowest one's time, not the sum.
    let mut errors = Vec::new();
    for w in waits {
        if let Err(e) = w.await {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vcdn_http::serve::{Response, ServeConfig};
    use vcdn_http::tls;

    /// An admin API on loopback that claims `identity`, over TLS with
    /// `cert` (PEM chain, key).
    async fn admin_api(identity: &str, cert: &tls::MadeCert) -> SocketAddr {
        let b = tls::parse_bundle(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let body = format!("{{\"instance_id\":\"{identity}\"}}");
        let h: vcdn_http::serve::Handler = std::sync::Arc::new(move |_req| {
            let body = body.clone();
            Box::pin(async move { Response::new(200, "application/json", body) })
        });
        let cfg = ServeConfig {
            tls: Some(tls::single_cert_config(b, &[b"http/1.1"])),
            ..Default::default()
        };
        tokio::spawn(vcdn_http::serve::serve(l, cfg, h));
        addr
    }

    fn instance(admin: SocketAddr) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": "i-1", "host": "h", "address": "127.0.0.1:1", "admin": admin.to_string(),
            "admin_https": true, "vcpus": 1, "memory_mib": 256, "state": "starting",
            "started_at": 0, "nonce": "n1",
        }))
        .unwrap()
    }

    /// The attack: a process on an instance's admin address with a
    /// certificate of its own, even claiming the instance's identity, is
    /// refused at once, saying why; the internal CA's certificate passes.
    #[tokio::test]
    async fn an_admin_certificate_not_of_the_internal_ca_is_refused_at_once() {
        let ca = tls::Ca::create("test internal CA", 1).unwrap();
        let internal = crate::pki::InternalCa {
            ca,
            cert_path: "ca.crt".into(),
        };
        let client = crate::pki::instance_admin_client(Some(&internal)).unwrap();
        let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];

        let good = internal.ca.issue(&names, 1).unwrap();
        let i = instance(admin_api("i-1.n1", &good).await);
        wait_ready(&client, std::slice::from_ref(&i), Duration::from_secs(5))
            .await
            .unwrap();

        let impostor = tls::self_signed(&names, 1).unwrap();
        let i = instance(admin_api("i-1.n1", &impostor).await);
        let t0 = Instant::now();
        let e = wait_ready(&client, std::slice::from_ref(&i), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "waited {:?}",
            t0.elapsed()
        );
        assert!(e.contains("not one the internal CA issued"), "{e}");
        assert!(e.contains(&format!("https://{}", i.admin)), "{e}");
        // Every other call says the same, and sends nothing.
        let e = instance_request(
            &client,
            &i,
            "GET",
            "/stats",
            &[],
            b"",
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
        assert!(e.contains("nothing was sent"), "{e}");

        // Another CA's certificate is refused too.
        let other = tls::Ca::create("another CA", 1).unwrap();
        let i = instance(admin_api("i-1.n1", &other.issue(&names, 1).unwrap()).await);
        let e = wait_ready(&client, std::slice::from_ref(&i), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
    }
}
