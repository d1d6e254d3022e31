//! `artune select`, `export`, `check`, `predict`.
use super::{CheckArgs, ExportArgs, PredictArgs, SelectArgs};
use crate::error::Error;

pub fn select(_a: SelectArgs) -> Result<i32, Error> {
    Err(Error::bad_input("select is not built yet"))
}
pub fn export(_a: ExportArgs) -> Result<i32, Error> {
    Err(Error::bad_input("export is not built yet"))
}
pub fn check(_a: CheckArgs) -> Result<i32, Error> {
    Err(Error::bad_input("check is not built yet"))
}
pub fn predict(_a: PredictArgs) -> Result<i32, Error> {
    Err(Error::bad_input("predict is not built yet"))
}
