use super::*;

#[test]
fn specs_parse_and_bad_ones_are_refused() {
    assert_eq!(
        HubSpec::parse("hf:org/repo:Q4_K_M").unwrap(),
        HubSpec {
            repo: "org/repo".into(),
            select: Some("Q4_K_M".into())
        }
    );
    assert_eq!(HubSpec::parse("a-b/c.d").unwrap().select, None);
    for bad in ["repo", "a/b/c", "../x", "org/..", "o/r:../../etc", "o rg/x"] {
        assert!(HubSpec::parse(bad).is_err(), "{bad}");
    }
    for bad in [
        "../../x.gguf",
        "/tmp/x.gguf",
        "a//b.gguf",
        "a/./b",
        "a\\b.gguf",
        "",
    ] {
        assert!(!safe_name(bad), "{bad}");
    }
    assert!(safe_name("sub/dir/model-Q4_K_M.gguf"));
}

#[test]
fn a_quantization_picks_its_file() {
    let files: Vec<String> = [
        "README.md",
        "model-Q4_K_M.gguf",
        "model-Q8_0.gguf",
        "model.Q4_K_S.gguf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        pick_gguf(&files, Some("q8_0")).unwrap().as_deref(),
        Some("model-Q8_0.gguf")
    );
    assert_eq!(
        pick_gguf(&files, None).unwrap().as_deref(),
        Some("model-Q4_K_M.gguf")
    );
    assert_eq!(
        pick_gguf(&files, Some("model.Q4_K_S.gguf"))
            .unwrap()
            .as_deref(),
        Some("model.Q4_K_S.gguf")
    );
    assert!(pick_gguf(&files, Some("Q2_K")).is_err());
    assert_eq!(pick_gguf(&["config.json".to_string()], None).unwrap(), None);
}

#[test]
fn redirects_from_a_public_server_stay_public_and_encrypted() {
    let local = [
        "http://127.0.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://[::1]/",
        "http://[fd00::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://localhost:8080/",
    ];
    for u in local {
        assert!(is_local(&Url::parse(u).expect("url")), "{u}");
    }
    for u in [
        "https://huggingface.co/",
        "https://1.2.3.4/",
        "https://[2001:db8::1]/",
    ] {
        assert!(!is_local(&Url::parse(u).expect("url")), "{u}");
    }
}

#[test]
fn server_names_are_checked_before_use() {
    let c = "0123456789ABCDEF0123456789abcdef01234567";
    assert_eq!(
        commit_id(c).as_deref(),
        Some(c.to_ascii_lowercase().as_str())
    );
    for bad in [
        "",
        "main",
        "/tmp/x",
        "../../../../x",
        &c[1..],
        &format!("{c}0"),
    ] {
        assert_eq!(commit_id(bad), None, "{bad}");
    }
    let sha = "a".repeat(64);
    assert_eq!(opaque_etag(&format!("\"{sha}\"")), Some(sha.clone()));
    assert_eq!(opaque_etag("W/\"abc-123\"").as_deref(), Some("abc-123"));
    for bad in [
        "",
        "\"\"",
        "../../etc",
        "/tmp/x",
        "a/b",
        "a\\b",
        "a\0b",
        "\"a\"b\"",
        "a.b",
        &"x".repeat(129),
    ] {
        assert_eq!(opaque_etag(bad), None, "{bad:?}");
    }
    assert_eq!(bad_name("sub/dir/model.gguf"), None);
    for bad in [
        "",
        "a\nb",
        "../x",
        "/x",
        "a/../b",
        "a\\b",
        &"x".repeat(256),
        &format!("{}/x", "y".repeat(1024)),
    ] {
        assert!(bad_name(bad).is_some(), "{bad:?}");
    }
    assert_eq!(content_range("bytes 10-19/20"), Some((10, Some(20))));
    assert_eq!(content_range("bytes 0-0/*"), Some((0, None)));
    for bad in [
        "bytes 10-9/20",
        "bytes 0-19/19",
        "bytes -1-2/3",
        "0-1/2",
        "bytes 0-1/x",
    ] {
        assert_eq!(content_range(bad), None, "{bad}");
    }
    assert_eq!(byte_count(" 42 "), Some(42));
    for bad in ["", "-1", "+1", "1e3", "0x10", "99999999999999999999999"] {
        assert_eq!(byte_count(bad), None, "{bad}");
    }
    assert_eq!(url_path("sub/a b%.gguf"), "sub/a%20b%25.gguf");
}

#[cfg(unix)]
#[test]
fn links_out_of_the_cache_are_refused() {
    let base = std::env::temp_dir().join(format!("kiln-hub-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (root, out) = (base.join("cache"), base.join("out"));
    std::fs::create_dir_all(root.join("r/inside")).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&out, root.join("r/blobs")).unwrap();
    std::os::unix::fs::symlink(root.join("r/inside"), root.join("r/ok")).unwrap();
    let err = ensure_dir(&root, &["r", "blobs"]).unwrap_err();
    assert!(format!("{err}").contains("leads out of the cache"), "{err}");
    assert!(ensure_dir(&root, &["r", "ok", "x"]).is_ok());
    assert!(ensure_dir(&root, &["r", ".."]).is_err());
    assert!(ensure_dir(&root, &["r", "a/b"]).is_err());
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&base);
}
