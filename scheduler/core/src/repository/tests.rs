use super::*;
use proptest::prelude::*;

const GOOD: &str = r#"
name: "cls"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "x", data_type: TYPE_FP32, dims: [ 3, 48, 192 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ], max_queue_delay_microseconds: 100 }
instance_group [ { count: 2, kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 1 } }
parameters { key: "slo_ms" value { string_value: "25" } }
"#;

fn write_model(root: &Path, name: &str, config: &str, versions: &[u64]) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    for v in versions {
        std::fs::create_dir_all(dir.join(v.to_string())).unwrap();
        std::fs::write(dir.join(v.to_string()).join("model.onnx"), b"not read here").unwrap();
    }
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symphony-repo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn reads_every_field() {
    let root = tmp("good");
    write_model(&root, "cls", GOOD, &[1, 3, 2]);
    let repo = scan(&root).unwrap();
    assert!(repo.refused.is_empty(), "{:?}", repo.refused);
    let m = repo.model("cls").unwrap();
    let c = &m.config;
    assert_eq!((c.platform.as_str(), c.max_batch_size), ("onnxruntime_onnx", 32));
    assert_eq!(c.inputs[0].dims, vec![3, 48, 192]);
    assert_eq!(c.inputs[0].sample_bytes(), Some(3 * 48 * 192 * 4));
    assert_eq!(c.outputs[0].data_type, DataType::F32);
    let db = c.dynamic_batching.as_ref().unwrap();
    assert_eq!((db.preferred_batch_size.clone(), db.max_queue_delay_us), (vec![4, 8], 100));
    assert_eq!(c.instance_group, InstanceGroup { count: 2, kind: InstanceKind::Cpu });
    assert_eq!(m.slo(), StdDuration::from_millis(25));
    // latest 1 of {1, 2, 3}
    assert_eq!(m.versions.len(), 1);
    assert_eq!(m.latest().version, 3);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_broken_model_is_refused_naming_file_and_field_and_the_others_load() {
    let root = tmp("broken");
    write_model(&root, "a_good", GOOD.replace("\"cls\"", "\"a_good\"").as_str(), &[1]);
    write_model(&root, "b_fp16", &GOOD.replace("\"cls\"", "\"b_fp16\"").replace("data_type: TYPE_FP32, dims: [ 3", "data_type: TYPE_FP16, dims: [ 3"), &[1]);
    write_model(&root, "c_syntax", "name: \"c_syntax\"\nmax_batch_size 4\n", &[1]);
    write_model(&root, "d_nofile", &GOOD.replace("\"cls\"", "\"d_nofile\""), &[]);
    write_model(&root, "e_dims", &GOOD.replace("\"cls\"", "\"e_dims\"").replace("dims: [ 2 ]", "dims: [ 0 ]"), &[1]);
    write_model(&root, "f_name", GOOD, &[1]);
    std::fs::create_dir_all(root.join("g_noconfig/1")).unwrap();
    let repo = scan(&root).unwrap();
    assert_eq!(repo.models.len(), 1);
    assert_eq!(repo.models[0].name(), "a_good");
    let msgs: Vec<String> = repo.refused.iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 6, "{msgs:#?}");
    let has = |model: &str, needle: &str| {
        assert!(
            msgs.iter().any(|m| m.contains(model) && m.contains(needle)),
            "no error for {model} containing '{needle}' in {msgs:#?}"
        )
    };
    has("b_fp16/config.pbtxt", "field 'input[0].data_type'");
    has("b_fp16/config.pbtxt", "TYPE_FP16");
    has("c_syntax/config.pbtxt", "line 2");
    has("d_nofile/1/model.onnx", "missing");
    has("e_dims/config.pbtxt", "output[0].dims");
    has("f_name/config.pbtxt", "field 'name'");
    has("g_noconfig/config.pbtxt", "missing");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn version_policies_and_reshape() {
    let c = |text: &str| config::from_message(&pbtxt::parse(text).unwrap(), "m");
    let base = "backend: \"onnxruntime\" input { name: \"x\" data_type: TYPE_INT64 dims: [ -1 ] } output { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } }";
    let m = c(base).unwrap();
    assert_eq!(m.inputs[0].sample_bytes(), None);
    assert_eq!(m.outputs[0].model_dims(), &[2, 2]);
    assert_eq!(c(&format!("{base} version_policy {{ all {{ }} }}")).unwrap().version_policy, VersionPolicy::All);
    assert_eq!(
        c(&format!("{base} version_policy {{ specific {{ versions: [1, 4] }} }}")).unwrap().version_policy,
        VersionPolicy::Specific(vec![1, 4])
    );
    let e = c(&format!("{base} version_policy {{ newest {{ }} }}")).unwrap_err();
    assert_eq!(e.field, "version_policy.newest");
    let e = c(&base.replace("shape: [ 2, 2 ]", "shape: [ 3, 2 ]")).unwrap_err();
    assert_eq!(e.field, "output[0].reshape.shape");
    let e = c(&format!("{base} platform: \"tensorflow_savedmodel\"")).unwrap_err();
    assert_eq!(e.field, "platform");
    let e = c(&format!("{base} parameters {{ key: \"slo_ms\" value {{ string_value: \"-3\" }} }}")).unwrap_err();
    assert_eq!(e.field, "parameters[slo_ms]");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    /// Untrusted bytes: parsing never panics, whatever the input.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        if let Ok(m) = pbtxt::parse(&text) {
            let _ = config::from_message(&m, "m");
        }
    }

    /// Mutations of a valid config (truncation, a byte replaced by a
    /// pbtxt-significant character) never panic either.
    #[test]
    fn mutated_configs_never_panic(cut in 0usize..GOOD.len(), at in 0usize..GOOD.len(), c in prop::sample::select(vec!['{', '}', '[', ']', ':', '"', '#', '-', '0', '9', ',', 'x', '\\', '<'])) {
        let mut s: Vec<char> = GOOD.chars().collect();
        s[at] = c;
        let s: String = s.into_iter().take(cut.max(1)).collect();
        if let Ok(m) = pbtxt::parse(&s) {
            let _ = config::from_message(&m, "cls");
        }
    }
}

#[test]
fn priority_levels_and_the_queue_bound_become_the_models_admission() {
    let root = tmp("admission");
    let cfg = GOOD.replace(
        "dynamic_batching { preferred_batch_size: [ 4, 8 ], max_queue_delay_microseconds: 100 }",
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 64 } }",
    );
    write_model(&root, "cls", &cfg, &[1]);
    let bad = cfg.replace("\"cls\"", "\"bad\"").replace("default_priority_level: 2", "default_priority_level: 3");
    write_model(&root, "bad", &bad, &[1]);
    let repo = scan(&root).unwrap();
    let db = repo.model("cls").unwrap().config.dynamic_batching.clone().unwrap();
    assert_eq!(db.admission(), crate::types::Admission { levels: 2, default_level: 2, max_queue: 64 });
    assert_eq!(DynamicBatching::default().admission(), crate::types::Admission::default());
    assert!(repo.model("bad").is_none());
    assert!(repo.refused.iter().any(|r| format!("{r:?}").contains("default_priority_level")), "{:?}", repo.refused);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn each_datatype_reads_back_from_both_spellings() {
    for d in DataType::ALL {
        assert_eq!(DataType::from_triton(d.triton_name()), Some(d));
        assert_eq!(DataType::from_kserve(d.kserve_name()), Some(d));
        assert_eq!(d.triton_name().strip_prefix("TYPE_"), Some(d.kserve_name()));
    }
    for unserved in ["TYPE_FP16", "TYPE_BF16", "TYPE_STRING", "FP32", "fp32"] {
        assert_eq!(DataType::from_triton(unserved), None, "{unserved}");
    }
    assert_eq!(DataType::from_kserve("BYTES"), None);
    assert_eq!(DataType::from_kserve("TYPE_FP32"), None);
}
