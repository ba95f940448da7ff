//! `vcdn calibrate`: measure what one vCPU of vcdn's cache sustains on this
//! machine and write the capacity model `vcdn up --capacity-model` reads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use vcdn_control::vim::{InstanceSpec, LocalVim, Vim};

#[derive(Args)]
pub struct CalibrateArgs {
    /// Where to write the capacity model (TOML).
    #[arg(long)]
    out: PathBuf,
    /// CPU share the cache is held to (small, so the player on the same
    /// machine is not the bottleneck; results are scaled to one CPU).
    #[arg(long, default_value_t = 0.1)]
    cpus: f64,
    /// CPU time one vCPU stands for (as `vcdn up --vcpu-share`); results
    /// are per such vCPU.
    #[arg(long, default_value_t = 1.0)]
    vcpu_share: f64,
    /// Seconds per measured throughput and latency run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds per video run (viewers need time to drain their buffers
    /// before a server that is too slow shows as stalls).
    #[arg(long, default_value_t = 32.0)]
    video_seconds: f64,
}

fn free_addr() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())
}

pub fn run(a: CalibrateArgs) -> Result<(), String> {
    if a.cpus.is_nan()
        || a.cpus < 0.01
        || a.cpus > 64.0
        || a.seconds.is_nan()
        || !(1.0..=3600.0).contains(&a.seconds)
        || !(1.0..=3600.0).contains(&a.video_seconds)
    {
        return Err(
            "give --cpus from 0.01 to 64 and --seconds and --video-seconds from 1 to 3600".into(),
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    let dir = std::env::temp_dir().join(format!("vcdn-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let vim = Arc::new(
        LocalVim::new(std::env::current_exe().map_err(|e| e.to_string())?, &dir)
            .map_err(|e| e.to_string())?,
    );
    let result = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let origin = l.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(vcdn_origin::run(l));
        let instance = vcdn_control::types::Instance {
            id: format!("calibrate-{}", std::process::id()),
            host: "local".into(),
            address: free_addr()?.to_string(),
            admin: free_addr()?.to_string(),
            admin_https: false,
            admin_name: None,
            vcpus: 1,
            memory_mib: 2048,
            state: vcdn_control::types::InstanceState::Starting,
            pid: None,
            cpu_limit: String::new(),
            started_at: 0,
            nonce: vcdn_control::control::random_hex(8),
            role: vcdn_control::types::Role::Cache,
            location: None,
        };
        let spec = InstanceSpec {
            id: instance.id.clone(),
            region: String::new(),
            service: "calibration".into(),
            customer: String::new(),
            host: instance.host.clone(),
            admin_name: None,
            identity: instance.identity(),
            listen: instance.address.parse().map_err(|e| format!("{e}"))?,
            admin: instance.admin.parse().map_err(|e| format!("{e}"))?,
            admin_token: vcdn_control::control::random_hex(16),
            upstream: format!("http://{origin}"),
            origin_policy: String::new(),
            origin_ca_pem: None,
            vcpus: 1,
            cpu_quota: a.cpus,
            memory_mib: 2048,
            proxy: None,
            tls_listen: None,
            admin_tls: None,
            telemetry: None,
            srv6: None,
        };
        let started = vim.start(&spec).map_err(|e| e.to_string())?;
        eprintln!(
            "calibrate: cache on http://{} held to {} CPU ({})",
            spec.listen, a.cpus, started.cpu_limit
        );
        let ready = vcdn_control::deployer::wait_ready(
            &vcdn_control::pki::instance_admin_client(None)?,
            std::slice::from_ref(&instance),
            Duration::from_secs(5),
        )
        .await;
        let model = match ready {
            Ok(()) => vcdn_player::calibrate::calibrate(vcdn_player::calibrate::CalibrateOptions {
                cache: spec.listen,
                cpus: a.cpus,
                vcpu_share: a.vcpu_share,
                run: Duration::from_secs_f64(a.seconds),
                video_run: Duration::from_secs_f64(a.video_seconds),
                progress: true,
            })
            .await
            .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let vim2 = vim.clone();
        let (id, pid) = (spec.id.clone(), started.pid);
        let _ = tokio::task::spawn_blocking(move || vim2.stop(&id, pid)).await;
        model
    });
    let _ = std::fs::remove_dir_all(&dir);
    let model = result?;
    let text = format!(
        "# Written by `vcdn calibrate --cpus {} --seconds {} --video-seconds {}`.\n{}",
        a.cpus,
        a.seconds,
        a.video_seconds,
        model.to_toml()
    );
    std::fs::write(&a.out, text).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    for t in &model.throughput {
        println!(
            "{:>8} B objects: {:>9.0} requests/s per vCPU",
            t.object_bytes, t.requests_per_s
        );
    }
    for v in &model.video {
        for p in &v.points {
            println!(
                "{:>8.0} HD sessions per vCPU: mean MOS {:.2}",
                p.sessions, p.mos
            );
        }
    }
    println!(
        "capacity model written to {} (use it with vcdn up --capacity-model)",
        a.out.display()
    );
    Ok(())
}
