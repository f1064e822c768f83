//! kiln's WebGPU backend (wgpu + our own WGSL in `shaders/`): Metal, Vulkan and DX12.
//!
//! This crate finds adapters and validates WGSL with naga. The kernels and the `Backend`
//! implementation are not written yet, so `open` reports the backend as not available and
//! every op runs on the CPU reference; `kiln info` and `kiln validate` say so.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::Error;

/// One adapter as wgpu reports it.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub api: String,
    pub device_type: String,
    pub driver: String,
}

/// Every adapter wgpu can see (Vulkan, Metal, DX12, GL). Never panics; an empty list when the
/// machine has no usable driver.
pub fn adapters() -> Vec<AdapterSummary> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let found = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    found
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary {
                name: info.name,
                api: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                driver: format!("{} {}", info.driver, info.driver_info)
                    .trim()
                    .to_string(),
            }
        })
        .collect()
}

/// Opens the WebGPU backend.
pub fn open() -> kiln_core::Result<Arc<dyn Backend>> {
    let found = adapters();
    if found.is_empty() {
        return Err(Error::NotAvailable(
            "wgpu: no WebGPU adapter found (needs a Vulkan, Metal or DX12 driver; on Linux without a GPU, Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into(),
        ));
    }
    let names: Vec<String> = found
        .iter()
        .map(|a| format!("{} ({})", a.name, a.api))
        .collect();
    Err(Error::NotAvailable(format!(
        "wgpu: adapters found [{}], but kiln's WGSL kernels are not built yet",
        names.join(", ")
    )))
}

/// Parses and validates WGSL source with naga; the error names the line and the problem.
pub fn validate_wgsl(name: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    let mut v = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    v.validate(&module)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    Ok(())
}

/// The shaders directory of the source tree.
pub fn shader_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shader_in_the_tree_validates() {
        let dir = shader_dir();
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("shaders/ exists") {
            let path = entry.expect("readable entry").path();
            if path.extension().is_some_and(|e| e == "wgsl") {
                let src = std::fs::read_to_string(&path).expect("readable shader");
                if let Err(e) = validate_wgsl(&path.display().to_string(), &src) {
                    panic!("{e}");
                }
                n += 1;
            }
        }
        println!("naga validated {n} shaders in {}", dir.display());
    }

    #[test]
    fn the_validator_rejects_a_broken_shader() {
        let good = "@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { y[g.x] = 2.0 * y[g.x]; }\n";
        assert!(validate_wgsl("good", good).is_ok());
        // A type error: f32 assigned from a vec2.
        let bad = good.replace("2.0 * y[g.x]", "vec2<f32>(1.0, 2.0)");
        let err = validate_wgsl("bad", &bad).unwrap_err();
        assert!(err.contains("bad"), "{err}");
    }

    #[test]
    fn open_reports_not_available_instead_of_panicking() {
        match open() {
            Err(Error::NotAvailable(msg)) => assert!(msg.starts_with("wgpu:"), "{msg}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("the wgpu backend has no kernels yet"),
        }
    }
}
