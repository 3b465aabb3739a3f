//! `billing-workload`: the invoice run of examples/billing. Exit codes: 0 committed (or already
//! committed by this same run), 2 bad input, 3 refused by the fence (do not retry), 1 anything
//! else (a retry may succeed).

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = billing_workload::Args::parse();
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
