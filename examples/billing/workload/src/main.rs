//! `billing-workload`: the invoice run of examples/billing. Exit codes: 0 committed (or already
//! committed by this same run), 2 bad input, 3 refused by the fence (do not retry), 1 anything
//! else (a retry may succeed).
//!
//! SIGTERM (the pod deleted, say by a `Replace`) does not stop a run half-way: it goes on to its
//! one transaction, and the fence decides whether that commits. A run frozen or paused past the
//! start of a newer run is refused there, which is the point of the example. (The kubelet's
//! SIGKILL after the grace period still ends it; nothing uncommitted survives that either.)

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = billing_workload::Args::parse();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::spawn(async move {
                while term.recv().await.is_some() {
                    println!("SIGTERM: finishing this run; the fence decides whether it commits");
                }
            });
        }
        Err(e) => eprintln!("billing-workload: cannot handle SIGTERM: {e}"),
    }
    match billing_workload::run(args).await {
        Ok(done) => {
            println!("{done}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("billing-workload: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
