//! The supervisor (the paper's instance manager): every tick it replaces
//! crashed instances; every ten ticks it starts and ends leases, reads
//! every instance's load and usage, and scales elastic services.

use std::sync::Arc;
use std::time::Instant;

use crate::control::Control;

pub async fn run(c: Arc<Control>) {
    let mut tick = tokio::time::interval(c.cfg.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    let mut last = Instant::now();
    loop {
        tick.tick().await;
        c.heal().await;
        if n.is_multiple_of(10) {
            c.leases().await;
            let dt = last.elapsed();
            last = Instant::now();
            c.observe(dt).await;
        }
        n += 1;
    }
}
