//! Prints a CRD as YAML: `crdgen` the SingletonJob's, `crdgen calendar` the SingletonCalendar's.
//! `make crds` writes them to crds/ (and the chart's files/), and `make test` fails when a
//! committed file differs.
fn main() -> Result<(), serde_yaml::Error> {
    let crd = match std::env::args().nth(1).as_deref() {
        None | Some("job") => singleton::api::crd(),
        Some("calendar") => singleton::api::calendar_crd(),
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?}; expected job or calendar");
            std::process::exit(2);
        }
    };
    print!("---\n{}", serde_yaml::to_string(&crd)?);
    Ok(())
}
