//! The algorithm table of the docs' "Choosing algorithms" page (`PAGE`) is generated from the
//! registry: one row per registered allreduce (its name, `description()` and `best_for()`), then
//! `auto`, between two marker comments. The test fails with a diff when the page differs;
//! `RINGLET_BLESS=1 cargo test --test core readme::` rewrites the region (and only it).

use _core::schedules::{
    Algorithm, ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCE, REDUCE_SCATTER,
};
use std::path::Path;

/// The page that holds the table, from the repository's root.
const PAGE: &str = "docs/guide/algorithms.md";

const BEGIN: &str = "<!-- algorithms: generated from src/schedules by tests/core/readme.rs; \
                     RINGLET_BLESS=1 cargo test --test core readme:: rewrites it -->";
const END: &str = "<!-- end of generated table -->";

/// The table, from the ALLREDUCE registry in its order.
fn allreduce_table() -> String {
    let mut lines = vec![
        "| `algorithm=` | what it does | best for |".to_string(),
        "|---|---|---|".to_string(),
    ];
    for algorithm in ALLREDUCE {
        lines.push(format!(
            "| `{}` | {} | {} |",
            algorithm.name(),
            algorithm.description(),
            algorithm.best_for()
        ));
    }
    lines.push("| `auto` (default) | what the cost model predicts fastest (below) | |".to_string());
    lines.join("\n")
}

/// What goes between the markers (blank lines around the table, so that markdown sees the
/// comments and the table as separate blocks).
fn region() -> String {
    format!("\n\n{}\n\n", allreduce_table())
}

/// A line diff of `old` against `new` (longest common subsequence): `-` the page's lines the
/// registry no longer gives, `+` the registry's lines the page lacks.
fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out += &format!("  {}\n", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            out += &format!("- {}\n", a[i]);
            i += 1;
        } else {
            out += &format!("+ {}\n", b[j]);
            j += 1;
        }
    }
    out
}

/// The page's text before, inside and after the markers.
fn split(page: &str) -> (&str, &str, &str) {
    assert_eq!(
        page.matches(BEGIN).count(),
        1,
        "{PAGE} must hold the line {BEGIN:?} once, where the allreduce table goes"
    );
    assert_eq!(
        page.matches(END).count(),
        1,
        "{PAGE} must hold the line {END:?} once, after the allreduce table"
    );
    let start = page.find(BEGIN).unwrap() + BEGIN.len();
    let end = page.find(END).unwrap();
    assert!(start <= end, "{END:?} comes before {BEGIN:?} in {PAGE}");
    (&page[..start], &page[start..end], &page[end..])
}

#[test]
fn the_docs_algorithm_table_is_the_registrys() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    let page = std::fs::read_to_string(&path).expect(PAGE);
    let (before, current, after) = split(&page);
    let wanted = region();
    if current == wanted {
        return;
    }
    if std::env::var("RINGLET_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, format!("{before}{wanted}{after}")).expect(PAGE);
        eprintln!("{PAGE}: the algorithm table rewritten from the registry");
        return;
    }
    panic!(
        "{PAGE}'s algorithm table is not the registry's (descriptions live in \
         src/schedules/<collective>/<algorithm>.rs; RINGLET_BLESS=1 cargo test --test core readme:: \
         rewrites it):\n{}",
        diff(current.trim(), wanted.trim())
    );
}

#[test]
fn the_table_has_one_row_per_registered_allreduce_and_auto() {
    let table = allreduce_table();
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(rows.len(), ALLREDUCE.len() + 1, "{table}");
    for (row, algorithm) in rows.iter().zip(ALLREDUCE) {
        assert!(
            row.starts_with(&format!("| `{}` |", algorithm.name())),
            "{row}"
        );
    }
    assert!(rows.last().unwrap().starts_with("| `auto` (default) |"));
}

/// Every registered algorithm of every collective says what it does and what it is for, in
/// text that fits one cell of a markdown table.
fn check_cells<T: Algorithm + ?Sized>(collective: &str, registry: &[&'static T]) -> usize {
    for algorithm in registry {
        let name = algorithm.name();
        for (what, text) in [
            ("description", algorithm.description()),
            ("best_for", algorithm.best_for()),
        ] {
            assert!(!text.trim().is_empty(), "{collective} {name}: empty {what}");
            assert!(
                !text.contains('|') && !text.contains('\n') && text.trim() == text,
                "{collective} {name}: {what} must fit one table cell (no '|', one line): {text:?}"
            );
        }
    }
    registry.len()
}

#[test]
fn every_algorithm_describes_itself_in_one_table_cell() {
    let checked = check_cells("allreduce", ALLREDUCE)
        + check_cells("broadcast", BROADCAST)
        + check_cells("reduce", REDUCE)
        + check_cells("allgather", ALLGATHER)
        + check_cells("reduce_scatter", REDUCE_SCATTER)
        + check_cells("alltoall", ALLTOALL);
    let registered = ALLREDUCE.len()
        + BROADCAST.len()
        + REDUCE.len()
        + ALLGATHER.len()
        + REDUCE_SCATTER.len()
        + ALLTOALL.len();
    assert_eq!(checked, registered);
    assert!(
        checked >= 21,
        "{checked} algorithms: a registry went missing"
    );
}

#[test]
fn the_diff_shows_what_changed() {
    let shown = diff("a\nb\nc", "a\nx\nc\nd");
    assert_eq!(shown, "  a\n- b\n+ x\n  c\n+ d\n");
}
