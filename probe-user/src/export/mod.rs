//! Export: the Prometheus scrape target and the JSON API.
pub mod family;
pub mod features;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod model;
pub mod serve;
pub mod sources;
pub mod webconfig;
