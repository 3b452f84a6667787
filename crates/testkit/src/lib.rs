//! What kvswitch's tests share across crates. [`table`]: the switch's table of cases, which
//! the switch's own tests and the XDP program's comparison with the switch both run.

pub mod table;
