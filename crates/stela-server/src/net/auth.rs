//! Who a connection is, and what it may ask: the daemon's authentication and its one check of
//! administrative requests.
//!
//! Identities: a Unix-socket peer running as the daemon's own user or as root (its uid from
//! `SO_PEERCRED`) is [`Identity::Local`], trusted as an administrator; any other user who
//! reaches the socket (through `--socket-group` and `--socket-mode`, which decide who can
//! connect at all) is a [`Identity::Client`]: it appends, commits and reads, and is refused
//! the administrative requests (issue 54, finding 6: a group member truncated and deleted
//! another user's log and ran power-fail). A TCP peer proves itself with
//! a token from `--admin-token-file` or `--token-file` sent in its Hello, or with a client
//! certificate rustls verified against `--tls-client-ca` (an administrator's if it names one of
//! `--tls-admin-name`); it is then [`Identity::Admin`] or [`Identity::Client`]. Without proof
//! it is refused, except on a `--tcp-insecure` loopback listener with no authentication
//! configured, where it is a client.
//!
//! Invariants:
//! - A token, when sent, decides: a wrong token is refused even if a certificate was verified.
//! - [`administrative`] is the one place that says which requests are administrative; the
//!   connection refuses them to anyone but an administrator and logs every one with its peer.

use crate::config::DaemonConfig;
use crate::error::StartError;
use crate::quota::Credential;
use std::sync::Arc;
use stela_net::tls::{self, rustls, Tokens};
use stela_proto::RequestBody;

/// Who a connection proved to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Identity {
    /// A peer on the Unix socket running as the daemon's user or as root: trusted.
    Local,
    /// A TCP peer authenticated as an administrator.
    Admin,
    /// A TCP peer authenticated as a client (or any peer of an insecure loopback listener).
    Client,
}

impl Identity {
    /// A Unix-socket peer running as `uid`: an administrator if that is the daemon's own user
    /// or root, a client otherwise (a member of the socket's group).
    pub fn of_local_user(uid: u32) -> Identity {
        if uid == 0 || uid == rustix::process::geteuid().as_raw() {
            Identity::Local
        } else {
            Identity::Client
        }
    }

    pub fn may_administer(self) -> bool {
        matches!(self, Identity::Local | Identity::Admin)
    }

    pub fn name(self) -> &'static str {
        match self {
            Identity::Local => "local",
            Identity::Admin => "admin",
            Identity::Client => "client",
        }
    }
}

/// A chunk of a backup over the network: refused as any administrative request, but admitted
/// quietly (one per MiB copied; the backup's hold, `backup`, is logged).
pub(crate) const BACKUP_READ: &str = "backup-read";

/// The name of `request` if it is administrative: it halts or changes what other clients
/// rely on (power-fail, power-restore, truncate, delete, release-hold), or reads every log's
/// files and holds them from truncation (a backup over the network).
pub(crate) fn administrative(request: &RequestBody) -> Option<&'static str> {
    match request {
        RequestBody::PowerFail => Some("power-fail"),
        RequestBody::PowerRestore => Some("power-restore"),
        RequestBody::Truncate { .. } => Some("truncate"),
        RequestBody::DeleteLog { .. } => Some("delete"),
        RequestBody::ReleaseHold { .. } => Some("release-hold"),
        RequestBody::Switchover { .. } => Some("switchover"),
        RequestBody::BackupLog { .. } => Some("backup"),
        RequestBody::ReadLogFile { .. } => Some(BACKUP_READ),
        RequestBody::Hello { .. }
        | RequestBody::Open { .. }
        | RequestBody::Append { .. }
        | RequestBody::Commit { .. }
        | RequestBody::Read { .. }
        | RequestBody::Positions { .. }
        | RequestBody::History { .. }
        | RequestBody::Close { .. }
        | RequestBody::MapRing { .. }
        | RequestBody::ListLogs
        | RequestBody::Status => None,
    }
}

/// The credential quotas charge a TCP client to (see [`crate::quota`]): the token it sent,
/// else its verified client certificate, else `anonymous` (an insecure loopback listener).
pub(crate) fn credential(
    tls: Option<&rustls::ServerConnection>,
    token: Option<&str>,
) -> Credential {
    if let Some(token) = token {
        return Credential::token(token);
    }
    match tls
        .and_then(|c| c.peer_certificates())
        .and_then(|chain| chain.first())
    {
        Some(cert) => Credential::certificate(cert.as_ref()),
        None => Credential::anonymous(),
    }
}

/// A TLS server configuration that a SIGHUP reload replaces whole (certificate rotation):
/// each new handshake takes the current one, sessions already set up keep theirs. Shared by
/// the TCP listener and the replication listener, so both serve the same certificate.
pub(crate) struct ServerTls(std::sync::RwLock<Arc<rustls::ServerConfig>>);

impl ServerTls {
    /// The configuration a handshake starting now uses.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn replace(&self, config: Arc<rustls::ServerConfig>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = config;
    }
}

/// How TCP peers are authenticated: loaded at start; the token files and the TLS files are
/// read again by a SIGHUP reload.
pub(crate) struct Auth {
    /// The TLS configuration of the TCP listener and of the replication listener (`--tls-cert`);
    /// `None`: no TLS (plain TCP is then `--tcp-insecure`).
    tls: Option<Arc<ServerTls>>,
    /// Replaced whole by a SIGHUP reload (token rotation); read under the lock per login.
    tokens: std::sync::RwLock<TokenFiles>,
    admin_names: Vec<String>,
    /// Some proof is asked for (a token or a client certificate).
    required: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tls", &self.tls.is_some())
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// The token files' contents.
struct TokenFiles {
    client: Option<Tokens>,
    admin: Option<Tokens>,
}

/// Why a reload (SIGHUP) left the running token files or TLS files in place.
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    #[error("token files added or removed: needs a restart")]
    TokenFilesAddedOrRemoved,
    #[error("TLS switched on or off: needs a restart")]
    TlsSwitchedOnOrOff,
    /// A file could not be read or does not hold what it should.
    #[error("{0}")]
    Files(#[from] tls::TlsError),
}

impl Auth {
    /// Reads the token files of `config` again (SIGHUP: token rotation). Tokens can be
    /// re-read, not switched on or off: whether the TLS listener asks for a client certificate
    /// depends on them, and it was built at start. On any error the old tokens stay.
    pub fn reload_tokens(&self, config: &DaemonConfig) -> Result<&'static str, ReloadRefused> {
        let mut tokens = self.tokens.write().unwrap_or_else(|e| e.into_inner());
        if tokens.client.is_some() != config.token_file.is_some()
            || tokens.admin.is_some() != config.admin_token_file.is_some()
        {
            return Err(ReloadRefused::TokenFilesAddedOrRemoved);
        }
        if tokens.client.is_none() && tokens.admin.is_none() {
            return Ok("no token files");
        }
        let load = |path: Option<&std::path::Path>| path.map(Tokens::load).transpose();
        let client = load(config.token_file.as_deref())?;
        let admin = load(config.admin_token_file.as_deref())?;
        *tokens = TokenFiles { client, admin };
        Ok("token files read again")
    }

    /// The TLS configuration new TCP connections get; `None`: plain TCP.
    pub fn tls(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.as_ref().map(|tls| tls.current())
    }

    /// The replaceable TLS configuration itself, for the replication listener.
    pub fn server_tls(&self) -> Option<Arc<ServerTls>> {
        self.tls.clone()
    }

    /// Reads the certificate, key and client CA of `config` again (SIGHUP: certificate
    /// rotation). Only files can change, not whether TLS is on: that decides how the listeners
    /// were set up. The new configuration is built (certificate, key matching it, client CA)
    /// before it replaces the running one; on any error the running one stays.
    pub fn reload_tls(&self, config: &DaemonConfig) -> Result<&'static str, ReloadRefused> {
        let files = config.tls.as_ref();
        let (Some(current), Some(files)) = (&self.tls, files) else {
            return if self.tls.is_some() == files.is_some() {
                Ok("no TLS")
            } else {
                Err(ReloadRefused::TlsSwitchedOnOrOff)
            };
        };
        let tokens = {
            let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
            tokens.client.is_some() || tokens.admin.is_some()
        };
        let fresh = tls::server_config(files, tokens)?;
        current.replace(fresh);
        Ok("certificate, key and client CA read again; new connections (clients and replication streams) use them")
    }

    /// Reads the certificates, keys and token files the configuration names.
    pub fn load(config: &DaemonConfig) -> Result<Auth, StartError> {
        let client_tokens = config.token_file.as_deref().map(Tokens::load).transpose()?;
        let admin_tokens = config
            .admin_token_file
            .as_deref()
            .map(Tokens::load)
            .transpose()?;
        let tokens = client_tokens.is_some() || admin_tokens.is_some();
        let client_ca = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        // With tokens as well, a client may come without a certificate (and send a token).
        // TLS files are there only for a TCP or a replication listener (`DaemonConfig::check`).
        let tls = match &config.tls {
            Some(files) => Some(tls::server_config(files, tokens)?),
            None => None,
        };
        Ok(Auth {
            tls: tls.map(|tls| Arc::new(ServerTls(std::sync::RwLock::new(tls)))),
            tokens: std::sync::RwLock::new(TokenFiles {
                client: client_tokens,
                admin: admin_tokens,
            }),
            admin_names: config.tls_admin_names.clone(),
            required: tokens || client_ca,
        })
    }

    /// The identity of a TCP peer that sent `token` in its Hello, over `tls` (its verified
    /// client certificate, if any). `Err`: why it is refused.
    pub fn identify(
        &self,
        tls: Option<&rustls::ServerConnection>,
        token: Option<&str>,
    ) -> Result<Identity, &'static str> {
        self.identify_certificates(tls.and_then(|c| c.peer_certificates()), token)
    }

    /// As [`Auth::identify`], from the certificates the peer presented (verified by rustls).
    pub fn identify_certificates(
        &self,
        certificates: Option<&[rustls::pki_types::CertificateDer<'_>]>,
        token: Option<&str>,
    ) -> Result<Identity, &'static str> {
        if let Some(token) = token {
            let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
            let admin = tokens
                .admin
                .as_ref()
                .is_some_and(|t| t.matches(token.as_bytes()));
            let client = tokens
                .client
                .as_ref()
                .is_some_and(|t| t.matches(token.as_bytes()));
            return match (admin, client) {
                (true, _) => Ok(Identity::Admin),
                (false, true) => Ok(Identity::Client),
                (false, false) => Err("wrong token"),
            };
        }
        // rustls only hands out a certificate it verified against the client CA.
        if let Some(cert) = certificates.and_then(|chain| chain.first()) {
            return Ok(if tls::certificate_names_any(cert, &self.admin_names) {
                Identity::Admin
            } else {
                Identity::Client
            });
        }
        if self.required {
            Err("no token and no client certificate")
        } else {
            Ok(Identity::Client)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_requests_that_change_others_state_are_administrative() {
        use RequestBody as R;
        assert_eq!(administrative(&R::PowerFail), Some("power-fail"));
        assert_eq!(administrative(&R::PowerRestore), Some("power-restore"));
        assert_eq!(
            administrative(&R::Truncate {
                handle: 0,
                before: 1
            }),
            Some("truncate")
        );
        assert_eq!(administrative(&R::Status), None);
        assert_eq!(
            administrative(&R::Commit {
                handle: 0,
                lsn: 1,
                durability: stela_proto::Durability::Disk
            }),
            None
        );
    }

    #[test]
    fn a_token_decides_and_without_proof_a_peer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let admin = dir.path().join("admin");
        let client = dir.path().join("client");
        stela_testkit::write_secret(&admin, "admin-token-0123456789\n");
        stela_testkit::write_secret(&client, "client-token-0123456789\n");
        let mut config = DaemonConfig::new(dir.path());
        config.token_file = Some(client);
        config.admin_token_file = Some(admin);
        let auth = Auth::load(&config).unwrap();
        assert_eq!(
            auth.identify(None, Some("admin-token-0123456789")),
            Ok(Identity::Admin)
        );
        assert_eq!(
            auth.identify(None, Some("client-token-0123456789")),
            Ok(Identity::Client)
        );
        assert_eq!(
            auth.identify(None, Some("client-token-012345678")),
            Err("wrong token")
        );
        assert!(auth.identify(None, None).is_err());
        // An insecure loopback listener without tokens: every peer is a client.
        let open = Auth::load(&DaemonConfig::new(dir.path())).unwrap();
        assert_eq!(open.identify(None, None), Ok(Identity::Client));
        assert!(!Identity::Client.may_administer());
        assert!(Identity::Admin.may_administer() && Identity::Local.may_administer());
    }
}
