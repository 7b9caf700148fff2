//! Topologies (Cluster, Sentinel, several servers), faults (proxy, network, process, runtime) and
//! the examples run as processes.
//! Each module is one test file (run one with `cargo test --test topologies <module>::`); they share
//! one binary so that the suite builds and links once, not once per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod examples_cli;
mod examples_scheduled_job;
mod examples_service;
mod examples_web_stock;
mod faults_network;
mod faults_proxy;
mod faults_runtime;
mod sentinel_halfopen;
mod topology_bench;
mod topology_cluster;
mod topology_cluster_faults;
mod topology_inspect;
mod topology_sentinel;
mod topology_servers;
mod topology_sharded;
mod unreachable;
