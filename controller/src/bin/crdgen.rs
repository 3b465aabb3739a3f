//! Prints the SingletonJob CRD as YAML; `make crds` writes it to crds/singletonjob.yaml and
//! `make test` fails when the committed file differs.
fn main() -> Result<(), serde_yaml::Error> {
    let crd = singleton::api::crd();
    print!("---\n{}", serde_yaml::to_string(&crd)?);
    Ok(())
}
