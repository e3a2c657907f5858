//! The operations a user can ask of an engine, whoever asks: the status read model, legal
//! holds, records in their wire form, policy reloads. `cli` parses arguments and prints, `api`
//! maps HTTP to these and errors to status codes; neither imports the other.

pub mod holds;
pub mod passes;
pub mod records;
pub mod reload;
pub mod status;
pub mod wire;
