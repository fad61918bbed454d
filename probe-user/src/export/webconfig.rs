//! `--web.config.file`: TLS, mutual TLS and basic auth for the HTTP endpoints, read from the
//! YAML file of the Prometheus exporter-toolkit (node_exporter and most exporters), with
//! the same keys, so that operators reuse the files they have. Relative paths in the file
//! are relative to the file's directory, as there.
use std::{
    collections::{BTreeMap, HashSet},
    hash::{BuildHasher, RandomState},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::{anyhow, bail, Context as _, Result};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    /// Inline PEM, instead of the files.
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    // Go's crypto/tls knobs: rustls offers only modern suites and curves and picks the order
    // itself. Accepted so existing files load, and said to be ignored.
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// What the endpoints enforce.
#[derive(Clone, Default)]
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    pub auth: Option<Arc<BasicAuth>>,
    /// Extra response headers (`http_server_config.headers`).
    pub headers: Vec<(String, String)>,
}

impl WebConfig {
    /// Reads and checks the file: every certificate and key is loaded now, so a bad file
    /// stops the start, not the first scrape.
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read web config file {}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).with_context(|| format!("web config file {}", path.display()))
    }

    /// Parses the YAML text; relative paths resolve against `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig> {
        let f: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_norway::from_str(text).map_err(|e| anyhow!("{e}"))?
        };
        let tls = f.tls_server_config.map(|t| tls(t, dir)).transpose()?;
        let auth = if f.basic_auth_users.is_empty() {
            None
        } else {
            Some(Arc::new(BasicAuth::new(f.basic_auth_users)?))
        };
        if auth.is_some() && tls.is_none() {
            tracing::warn!(
                "web config: basic auth without TLS sends passwords in clear text; add tls_server_config"
            );
        }
        let mut headers = Vec::new();
        if let Some(h) = f.http_server_config {
            if h.http2 == Some(true) {
                tracing::info!("web config: http2 is ignored, probe serves HTTP/1.1");
            }
            for (k, v) in h.headers {
                axum::http::HeaderName::try_from(k.as_str()).map_err(|_| {
                    anyhow!("http_server_config.headers: `{k}` is not a header name")
                })?;
                axum::http::HeaderValue::try_from(v.as_str()).map_err(|_| {
                    anyhow!("http_server_config.headers: the value of `{k}` is not a header value")
                })?;
                headers.push((k, v));
            }
        }
        Ok(WebConfig { tls, auth, headers })
    }
}

fn tls(t: TlsFile, dir: &Path) -> Result<Arc<ServerConfig>> {
    let rel = |p: &Path| dir.join(p);
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;
    let certs: Vec<CertificateDer<'static>> = match (&t.cert_file, &t.cert) {
        (Some(_), Some(_)) => bail!("tls_server_config: give cert_file or cert, not both"),
        (Some(p), None) => CertificateDer::pem_file_iter(rel(p))
            .and_then(|i| i.collect())
            .map_err(|e| anyhow!("tls_server_config.cert_file {}: {e}", rel(p).display()))?,
        (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("tls_server_config.cert: {e}"))?,
        (None, None) => bail!("tls_server_config: cert_file (or cert) is required"),
    };
    if certs.is_empty() {
        bail!("tls_server_config: no certificate in the cert PEM");
    }
    let key: PrivateKeyDer<'static> = match (&t.key_file, &t.key) {
        (Some(_), Some(_)) => bail!("tls_server_config: give key_file or key, not both"),
        (Some(p), None) => PrivateKeyDer::from_pem_file(rel(p))
            .map_err(|e| anyhow!("tls_server_config.key_file {}: {e}", rel(p).display()))?,
        (None, Some(pem)) => PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| anyhow!("tls_server_config.key: {e}"))?,
        (None, None) => bail!("tls_server_config: key_file (or key) is required"),
    };
    let ignored: Vec<&str> = [
        ("cipher_suites", t.cipher_suites.is_some()),
        ("curve_preferences", t.curve_preferences.is_some()),
        (
            "prefer_server_cipher_suites",
            t.prefer_server_cipher_suites.is_some(),
        ),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if !ignored.is_empty() {
        tracing::info!(
            "web config: {} ignored: rustls uses its own modern suites and curves",
            ignored.join(", ")
        );
    }
    if t.client_allowed_sans.is_some() {
        bail!("tls_server_config.client_allowed_sans is not supported; trust a client CA that signs only the scrapers' certificates");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| anyhow!("tls_server_config: {e}"))?;
    let auth_type = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let builder = match auth_type {
        "NoClientCert" => {
            if t.client_ca_file.is_some() {
                tracing::warn!("web config: client_ca_file is unused with client_auth_type NoClientCert");
            }
            builder.with_no_client_auth()
        }
        "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
            let Some(ca) = &t.client_ca_file else {
                bail!("tls_server_config: client_auth_type {auth_type} needs client_ca_file");
            };
            let mut roots = RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(rel(ca))
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    anyhow!("tls_server_config.client_ca_file {}: {e}", rel(ca).display())
                })?;
            for c in cas {
                roots.add(c).map_err(|e| {
                    anyhow!("tls_server_config.client_ca_file {}: {e}", rel(ca).display())
                })?;
            }
            if roots.is_empty() {
                bail!(
                    "tls_server_config.client_ca_file {}: no certificate in it",
                    rel(ca).display()
                );
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if auth_type == "VerifyClientCertIfGiven" {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(
                v.build()
                    .map_err(|e| anyhow!("tls_server_config.client_ca_file: {e}"))?,
            )
        }
        "RequestClientCert" | "RequireAnyClientCert" => bail!(
            "tls_server_config.client_auth_type {auth_type} accepts unverified certificates; probe supports NoClientCert, VerifyClientCertIfGiven and RequireAndVerifyClientCert"
        ),
        other => bail!(
            "tls_server_config.client_auth_type `{other}` is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
        ),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("tls_server_config: the key does not go with the certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>> {
    let rank = |key: &str, v: &str| -> Result<u8> {
        match v {
            "TLS12" => Ok(2),
            "TLS13" => Ok(3),
            "TLS10" | "TLS11" => {
                bail!("tls_server_config.{key} {v}: TLS 1.0 and 1.1 are not offered, use TLS12 or TLS13")
            }
            _ => bail!("tls_server_config.{key} `{v}` is not TLS12 or TLS13"),
        }
    };
    let lo = min
        .map(|v| rank("min_version", v))
        .transpose()?
        .unwrap_or(2);
    let hi = max
        .map(|v| rank("max_version", v))
        .transpose()?
        .unwrap_or(3);
    if lo > hi {
        bail!("tls_server_config: min_version is above max_version");
    }
    Ok([(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(r, _)| (lo..=hi).contains(r))
        .map(|(_, v)| v)
        .collect())
}

/// Users and their bcrypt hashes. A verified `Authorization` header is remembered (as a
/// keyed hash, not the password), because bcrypt costs tens of milliseconds by design and
/// Prometheus sends the same header at every scrape.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    verified: Mutex<HashSet<u64>>,
    keys: RandomState,
}

/// Verified headers remembered; past this the memory is cleared (passwords change rarely).
const REMEMBERED: usize = 64;
/// Compared against when the user is unknown, so that an unknown user takes as long as a
/// wrong password (the hash of a random string).
const DUMMY_HASH: &str = "$2y$10$9.CNEoBpi8BlKRiodui/z.ynnZnWmgW59TSgs567oYLNHEPlqQuGe";

impl BasicAuth {
    fn new(users: BTreeMap<String, String>) -> Result<BasicAuth> {
        for (u, h) in &users {
            if u.contains(':') {
                bail!("basic_auth_users: user `{u}` contains ':'");
            }
            h.parse::<bcrypt::HashParts>().map_err(|_| {
                anyhow!("basic_auth_users: the password of `{u}` is not a bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
            })?;
        }
        Ok(BasicAuth {
            users,
            verified: Mutex::new(HashSet::new()),
            keys: RandomState::new(),
        })
    }

    /// Whether the value of an `Authorization` header names a user with the right password.
    pub fn allows(&self, header: Option<&str>) -> bool {
        let Some(h) = header else { return false };
        let key = self.keys.hash_one(h);
        if self.verified.lock().is_ok_and(|v| v.contains(&key)) {
            return true;
        }
        let Some((user, pass)) = decode(h) else {
            return false;
        };
        let ok = match self.users.get(&user) {
            Some(hash) => bcrypt::verify(&pass, hash).unwrap_or(false),
            None => {
                let _ = bcrypt::verify(&pass, DUMMY_HASH);
                false
            }
        };
        if ok {
            if let Ok(mut v) = self.verified.lock() {
                if v.len() >= REMEMBERED {
                    v.clear();
                }
                v.insert(key);
            }
        }
        ok
    }
}

/// `Basic base64(user:password)` -> (user, password).
fn decode(header: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let (scheme, b64) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_enforces_nothing() {
        let c = WebConfig::parse("", Path::new(".")).unwrap();
        assert!(c.tls.is_none() && c.auth.is_none());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let e = |y: &str| {
            format!(
                "{:#}",
                WebConfig::parse(y, Path::new("/nonexistent"))
                    .err()
                    .expect("a bad file is an error")
            )
        };
        assert!(e("tls_server_config:\n  key_file: k.pem\n").contains("cert_file"));
        assert!(
            e("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n")
                .contains("/nonexistent/c.pem")
        );
        assert!(e("basic_auth_users:\n  alice: secret\n").contains("not a bcrypt hash"));
        assert!(e("tls_config:\n  cert_file: c.pem\n").contains("unknown field"));
        assert!(
            e("tls_server_config:\n  cert: x\n  key: y\n  min_version: TLS11\n")
                .contains("TLS 1.0 and 1.1")
        );
    }

    #[test]
    fn basic_auth_checks_the_password_and_remembers_only_success() {
        // `htpasswd -nbBC 4 alice wonderland` (Apache's tool, not the bcrypt crate).
        let users = BTreeMap::from([(
            "alice".to_owned(),
            "$2y$04$8x8Mv2Kfl5taHlwdfymOBukXudNU/MwujCEu6iVI9QpAkDAp9G./K".to_owned(),
        )]);
        let a = BasicAuth::new(users).unwrap();
        // base64("alice:wonderland"), base64("alice:wrong"), base64("bob:wonderland")
        assert!(a.allows(Some("Basic YWxpY2U6d29uZGVybGFuZA==")));
        assert!(a.allows(Some("basic YWxpY2U6d29uZGVybGFuZA==")));
        assert!(!a.allows(Some("Basic YWxpY2U6d3Jvbmc=")));
        assert!(!a.allows(Some("Basic Ym9iOndvbmRlcmxhbmQ=")));
        assert!(!a.allows(Some("Bearer YWxpY2U6d29uZGVybGFuZA==")));
        assert!(!a.allows(None));
        assert_eq!(a.verified.lock().unwrap().len(), 2);
    }
}
