fn main() {
    let d = vcdn_srv6::dispatcher::Dispatcher::load(&Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let a = vcdn_srv6::agent::Agent::load(&vcdn_srv6::agent::AgentConfig {
        sid: "fd77:0:0:3::100".parse().unwrap(),
        table: 100,
        filter: vcdn_srv6::agent::Filter::Lru(100),
        conns: 1000,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{}\n{}\n{}\n{}",
        d.dispatch_program().display(),
        d.learn_program().display(),
        a.agent_program().display(),
        a.reply_program().display()
    );
    std::thread::sleep(std::time::Duration::from_secs(40));
}
