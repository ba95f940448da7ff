//! Prometheus HTTP service discovery (`GET /v1/prometheus/targets`): every
//! running instance's metrics address and the router's, with the labels
//! an operator filters and groups by, so a Prometheus pointed at `vcdn
//! up` scrapes what the platform runs as it changes.
//!
//! The targets' `/metrics` are open and served over HTTPS with
//! certificates of the internal CA (`DATA_DIR/ca.crt`); an instance
//! recorded before admin APIs had TLS is listed with `__scheme__` http.
//! The control plane itself (its API's own certificate) is a static
//! target: `deploy/prometheus/prometheus.yml` shows both jobs.

use serde_json::{json, Value};

use crate::types::{Instance, InstanceState, Role, Service, ServiceState};

/// The target groups of the HTTP SD format: one per target, with labels
/// `service`, `service_name`, `customer`, `region`, `host`, `role`
/// (cache, proxy, gateway, router) and `instance_id`.
pub fn targets(
    services: &[Service],
    router_admin: std::net::SocketAddr,
    router_https: bool,
) -> Value {
    let mut groups = vec![json!({
        "targets": [router_admin.to_string()],
        "labels": {"role": "router", "__scheme__": scheme(router_https)},
    })];
    let live = services.iter().filter(|s| {
        matches!(
            s.state,
            ServiceState::Active | ServiceState::Degraded | ServiceState::Deleting
        )
    });
    for s in live {
        let group = |i: &Instance, region: &str, role: &str| {
            json!({
                "targets": [i.admin],
                "labels": {
                    "service": s.id,
                    "service_name": s.spec.name,
                    "customer": s.customer,
                    "region": region,
                    "host": i.host,
                    "role": role,
                    "instance_id": i.id,
                    "__scheme__": scheme(i.admin_https),
                },
            })
        };
        let running = |i: &&Instance| i.state != InstanceState::Failed;
        for r in &s.graph.regions {
            for i in r.instances.iter().filter(running) {
                groups.push(group(i, &r.region, "cache"));
            }
        }
        if let Some(a) = &s.graph.accel {
            for i in a.proxies.iter().filter(running) {
                let role = if i.role == Role::Proxy {
                    "proxy"
                } else {
                    "cache"
                };
                groups.push(group(i, i.location.as_deref().unwrap_or(""), role));
            }
        }
        if let Some(v) = &s.graph.srv6 {
            if running(&&v.gateway) {
                let region = v.gateway.location.as_deref().unwrap_or("");
                groups.push(group(&v.gateway, region, "gateway"));
            }
        }
    }
    Value::Array(groups)
}

fn scheme(https: bool) -> &'static str {
    if https {
        "https"
    } else {
        "http"
    }
}
