//! How a command names a daemon it talks to as an administrator (`stela cluster`,
//! `stela backup --from`): a daemon directory (its socket is DIR/stela.sock), a socket path,
//! `tcp://HOST:PORT`, or `tls://HOST:PORT` with the CA, client certificate and token file that
//! [`NodeTls`] gathers. Owns only the parsing into a [`stela_client::Address`].

use anyhow::Context;
use clap::Args;
use std::path::{Path, PathBuf};
use stela_client::Address;

/// How `tls://HOST:PORT` nodes are reached: the same CA and credential for each.
#[derive(Args, Debug, Clone, Default)]
pub struct NodeTls {
    /// The CA the nodes' certificates chain to (PEM); needed for tls:// nodes.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for nodes with --tls-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A file whose first token authenticates to each tls:// node (an admin token for
    /// `switchover` and `backup --from`).
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub token_file: Option<PathBuf>,
}

/// The address `node` names, reached with `tls`'s credentials when it is `tls://`.
pub(crate) fn address_of(node: &str, tls: &NodeTls) -> anyhow::Result<Address> {
    if Path::new(node).is_dir() {
        return Ok(Address::Unix(Path::new(node).join("stela.sock")));
    }
    if !node.starts_with("tls://") {
        return Address::parse(node).with_context(|| format!("--node {node}"));
    }
    let ca = tls.tls_ca.as_ref().with_context(|| {
        format!("--node {node} needs --tls-ca FILE (the CA of its certificate)")
    })?;
    let mut target =
        stela_client::TlsTarget::new(node, ca).with_context(|| format!("--node {node}"))?;
    if let (Some(cert), Some(key)) = (&tls.tls_cert, &tls.tls_key) {
        target = target.client_cert(cert, key);
    }
    if let Some(file) = &tls.token_file {
        target = target.token_file(file);
    }
    Ok(Address::Tls(Box::new(target)))
}
