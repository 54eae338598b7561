//! One module per `kvb` subcommand.

pub mod chat;
pub mod demo;
pub mod engine_args;
pub mod generate;
pub mod replay;
pub mod text_file;
pub mod verify;
