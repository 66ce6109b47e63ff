//! The part of XLA's FFI C API (`xla/ffi/api/c_api.h`, API version 0.x) that ringlet's handlers
//! use: the call frame, buffers, attributes, errors, and the metadata handshake. Declared here
//! rather than generated, so that building ringlet needs neither jaxlib nor its headers; the
//! layouts are XLA's stable C ABI.

use std::ffi::{c_char, c_void};

/// The C API version these declarations follow; XLA accepts handlers of an older minor version.
pub const API_MAJOR: i32 = 0;
pub const API_MINOR: i32 = 1;

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub kind: i32,
    pub next: *mut ExtensionBase,
}

/// `XLA_FFI_Extension_Metadata`: XLA asks the handler what it is instead of running it.
pub const EXTENSION_METADATA: i32 = 1;

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: i32,
    pub minor_version: i32,
}

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
}

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: ExtensionBase,
    pub metadata: *mut Metadata,
}

/// An error made by XLA (`XLA_FFI_Error`), opaque.
pub enum Error {}

/// `XLA_FFI_Error_Code_INVALID_ARGUMENT` and `_INTERNAL`.
pub const CODE_INVALID_ARGUMENT: i32 = 3;
pub const CODE_INTERNAL: i32 = 13;

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub message: *const c_char,
    pub errc: i32,
}

type ErrorCreate = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut Error;

/// The start of `XLA_FFI_Api`: only `XLA_FFI_Error_Create` is used.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api_version: ApiVersion,
    pub internal_api: *const c_void,
    pub error_create: Option<ErrorCreate>,
}

/// `XLA_FFI_DataType` values of the dtypes ringlet reduces.
pub mod data_type {
    pub const S32: i32 = 4;
    pub const S64: i32 = 5;
    pub const F16: i32 = 10;
    pub const F32: i32 = 11;
    pub const F64: i32 = 12;
    pub const BF16: i32 = 16;
    pub const TOKEN: i32 = 17;
}

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub dtype: i32,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *const i64,
}

#[repr(C)]
pub struct Args {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const i32,
    pub args: *const *mut c_void,
}

#[repr(C)]
pub struct Rets {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const i32,
    pub rets: *const *mut c_void,
}

/// `XLA_FFI_ArgType_BUFFER`, `XLA_FFI_RetType_BUFFER`.
pub const BUFFER: i32 = 1;

/// `XLA_FFI_AttrType_SCALAR` and `_STRING`.
pub const ATTR_SCALAR: i32 = 3;
pub const ATTR_STRING: i32 = 4;

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Scalar {
    pub dtype: i32,
    pub value: *const c_void,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const i32,
    pub names: *const *const ByteSpan,
    pub attrs: *const *const c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: i32,
    pub args: Args,
    pub rets: Rets,
    pub attrs: Attrs,
}

/// `XLA_FFI_ExecutionStage_EXECUTE`.
pub const STAGE_EXECUTE: i32 = 3;

/// A handler, as XLA calls it.
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut Error;
