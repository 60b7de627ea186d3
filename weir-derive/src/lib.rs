//! `#[derive(Persist)]` for weir: how a record, key or accumulator type is written to a
//! checkpoint and read back. Re-exported as `weir::Persist`; see the `weir::persist` module
//! for the encoding and for what may change in a type between a checkpoint and a restore.
//!
//! Every struct and every enum variant is written as a length-prefixed frame of its fields in
//! declaration order (an enum first writes its variant's index). The frame is what lets a type
//! evolve: a trailing field marked `#[persist(default)]` that a frame written before it lacks
//! restores as `Default::default()`, and anything else that does not fit is an error that
//! names the type and the field.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, GenericParam};

/// Derives `weir::persist::Persist`. Type parameters get a `Persist` bound.
///
/// Field attribute `#[persist(default)]`: the field may be missing from data written before
/// it was added (it must then be one of the last fields, after every field without it).
#[proc_macro_derive(Persist, attributes(persist))]
pub fn derive_persist(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// One field: how to name it in code and in errors, and whether it may be missing.
struct Field {
    access: Tokens,
    binding: syn::Ident,
    label: String,
    defaulted: bool,
}

fn fields_of(fields: &Fields) -> syn::Result<Vec<Field>> {
    let mut out = Vec::new();
    let mut seen_default = None;
    for (i, f) in fields.iter().enumerate() {
        let mut defaulted = false;
        for attr in f.attrs.iter().filter(|a| a.path().is_ident("persist")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("default") {
                    defaulted = true;
                    Ok(())
                } else {
                    Err(meta.error("unknown persist attribute: the only one is `#[persist(default)]`"))
                }
            })?;
        }
        let (access, label) = match &f.ident {
            Some(name) => (quote!(#name), name.to_string()),
            None => {
                let index = syn::Index::from(i);
                (quote!(#index), i.to_string())
            }
        };
        if defaulted {
            seen_default.get_or_insert(label.clone());
        } else if let Some(first) = &seen_default {
            return Err(syn::Error::new(
                f.span(),
                format!(
                    "field `{label}` comes after `{first}`, which is #[persist(default)]: a field that may be missing \
                     from older data must come after every field that may not (new fields go at the end)"
                ),
            ));
        }
        out.push(Field { access, binding: format_ident!("__f{}", i), label, defaulted });
    }
    Ok(out)
}

/// Writes the fields (bound to their `binding`s) into one frame.
fn write_frame(fields: &[Field]) -> Tokens {
    let writes = fields.iter().map(|f| {
        let b = &f.binding;
        quote!(::weir::persist::Persist::persist(#b, __out);)
    });
    quote! {
        let __frame = ::weir::persist::begin_frame(__out);
        #(#writes)*
        ::weir::persist::end_frame(__out, __frame);
    }
}

/// Reads one frame into the fields' `binding`s; `what` names the type (and variant) in errors.
fn read_frame(fields: &[Field], what: &str) -> Tokens {
    let reads = fields.iter().map(|f| {
        let b = &f.binding;
        let label = &f.label;
        if f.defaulted {
            quote! {
                let #b = if __frame.is_empty() {
                    ::core::default::Default::default()
                } else {
                    ::weir::persist::field(&mut __frame, #what, #label)?
                };
            }
        } else {
            quote!(let #b = ::weir::persist::field(&mut __frame, #what, #label)?;)
        }
    });
    quote! {
        let mut __frame = ::weir::persist::take_frame(__input, #what)?;
        #(#reads)*
        ::weir::persist::end_of_frame(__frame, #what)?;
    }
}

/// A pattern or constructor from the fields' bindings.
fn construct(path: Tokens, fields: &Fields, list: &[Field]) -> Tokens {
    let bindings = list.iter().map(|f| &f.binding);
    match fields {
        Fields::Named(_) => {
            let names = list.iter().map(|f| &f.access);
            quote!(#path { #(#names: #bindings),* })
        }
        Fields::Unnamed(_) => quote!(#path ( #(#bindings),* )),
        Fields::Unit => quote!(#path),
    }
}

/// A struct's `persist` and `restore` bodies: its fields in a frame.
fn struct_bodies(name: &syn::Ident, s: &syn::DataStruct) -> syn::Result<(Tokens, Tokens)> {
    let list = fields_of(&s.fields)?;
    let pattern = construct(quote!(#name), &s.fields, &list);
    let write = write_frame(&list);
    let read = read_frame(&list, &name.to_string());
    let built = construct(quote!(#name), &s.fields, &list);
    Ok((
        quote! {
            #[allow(unused_variables)]
            let #pattern = self;
            #write
        },
        quote! {
            #read
            ::core::result::Result::Ok(#built)
        },
    ))
}

/// An enum's `persist` and `restore` bodies: the variant's index, then its fields in a frame.
fn enum_bodies(name: &syn::Ident, e: &syn::DataEnum) -> syn::Result<(Tokens, Tokens)> {
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for (index, v) in e.variants.iter().enumerate() {
        let index = index as u64;
        let vname = &v.ident;
        let list = fields_of(&v.fields)?;
        let pattern = construct(quote!(#name::#vname), &v.fields, &list);
        let write = write_frame(&list);
        let read = read_frame(&list, &format!("{name}::{vname}"));
        writes.push(quote! {
            #pattern => {
                ::weir::persist::write_varint(#index, __out);
                #write
            }
        });
        reads.push(quote! {
            #index => {
                #read
                ::core::result::Result::Ok(#pattern)
            }
        });
    }
    let what = name.to_string();
    Ok((
        quote! {
            match self {
                #(#writes)*
            }
        },
        quote! {
            match ::weir::persist::read_varint(__input, #what)? {
                #(#reads)*
                __other => ::core::result::Result::Err(::weir::persist::unknown_variant(#what, __other)),
            }
        },
    ))
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    let mut generics = input.generics.clone();
    for p in &mut generics.params {
        if let GenericParam::Type(t) = p {
            t.bounds.push(syn::parse_quote!(::weir::persist::Persist));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let (persist, restore) = match &input.data {
        Data::Struct(s) => struct_bodies(name, s)?,
        Data::Enum(e) => enum_bodies(name, e)?,
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span(),
                "Persist cannot be derived for a union: weir cannot know which field holds the value",
            ))
        }
    };
    Ok(quote! {
        impl #impl_generics ::weir::persist::Persist for #name #ty_generics #where_clause {
            fn persist(&self, __out: &mut ::std::vec::Vec<u8>) {
                #persist
            }
            fn restore(__input: &mut &[u8]) -> ::weir::Result<Self> {
                #restore
            }
        }
    })
}
