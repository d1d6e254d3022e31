//! Workers lost, late or answering nonsense: replaced at once, never charged to the next
//! backend, never a panic.

use super::*;
use crate::fabric::{Backend, Direction, Fabric};
