//! `artune tune`, `show`, `bench`.
use super::{BenchArgs, ShowArgs, TuneArgs};
use crate::error::Error;

pub fn run(_a: TuneArgs) -> Result<i32, Error> {
    Err(Error::bad_input("tune is not built yet"))
}

pub fn show(_a: ShowArgs) -> Result<i32, Error> {
    Err(Error::bad_input("show is not built yet"))
}

pub fn bench(_a: BenchArgs) -> Result<i32, Error> {
    Err(Error::bad_input("bench is not built yet"))
}
