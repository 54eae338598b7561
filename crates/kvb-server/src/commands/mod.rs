//! One module per `kvb` subcommand.

pub mod generate;
