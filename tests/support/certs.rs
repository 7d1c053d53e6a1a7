//! Certificates made per test: a CA, server certificates for the names a test chooses, and
//! client certificates, written as PEM files for the servers and for summaryd.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM), what a client trusts.
    pub ca_file: PathBuf,
    dir: PathBuf,
}

/// A certificate and its key, as files.
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    /// A new CA whose files live in `dir` (created), named after `name`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        std::fs::create_dir_all(dir).expect("cert dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("summaryd test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("ca key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign ca");
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, issuer.pem()).expect("write ca");
        TestCa {
            issuer,
            ca_file,
            dir: dir.to_owned(),
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, file_stem: &str, names: &[&str]) -> Issued {
        self.issue(file_stem, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate (for mutual TLS).
    pub fn client(&self, file_stem: &str) -> Issued {
        self.issue(file_stem, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, stem: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        let sans: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or(stem));
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        let issued = Issued {
            cert_file: self.dir.join(format!("{stem}.pem")),
            key_file: self.dir.join(format!("{stem}.key")),
        };
        std::fs::write(&issued.cert_file, cert.pem()).expect("write cert");
        std::fs::write(&issued.key_file, key.serialize_pem()).expect("write key");
        restrict(&issued.key_file);
        issued
    }
}

/// Servers (Postgres above all) refuse a private key others can read.
fn restrict(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
}
