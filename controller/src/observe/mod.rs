//! Observe: what is, before anything is decided. The SingletonJob's own Jobs held against its
//! status ([`owned()`], pure), the state of its active runs' Jobs ([`runs`]), and its backstop
//! database ([`backstop`]).

pub mod backstop;
pub mod owned;
pub mod runs;

pub use owned::{
    Behind, OwnedJob, Release, behind, known, owned, ran, started_outside, to_resume, unknown,
    unrun_prepared,
};
