//! The benchmark's output: results.csv, latency.svg, scaling.svg and the results block of README.md.

use crate::{PluginCost, Run, SideResults, Stats};
use std::fmt::Write as _;
use std::path::PathBuf;

const BEGIN: &str = "<!-- cni-bench results: begin (generated, do not edit) -->";
const END: &str = "<!-- cni-bench results: end -->";

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

fn mb(b: u64) -> String {
    format!("{:.2} MB", b as f64 / 1e6)
}

fn machine_line(run: &Run) -> String {
    let m = &run.machine;
    format!(
        "{} · {} CPUs ({}) · Linux {} · reference containernetworking-plugins {} · cni-rs {}",
        m.date, m.nproc, m.cpu, m.kernel, m.reference_version, m.ours_rev
    )
}

/// The same, short enough for the width of a plot (the CPU model and the package name left out).
fn plot_machine_line(run: &Run) -> String {
    let m = &run.machine;
    format!(
        "{} · {} CPUs · Linux {} · reference {} · cni-rs {}",
        m.date, m.nproc, m.kernel, m.reference_version, m.ours_rev
    )
}

fn csv(run: &Run) -> String {
    let mut s = String::from("section,side,metric,level,value,unit\n");
    let m = &run.machine;
    for (k, v) in [
        ("date", m.date.clone()),
        ("nproc", m.nproc.to_string()),
        ("kernel", m.kernel.clone()),
        ("cpu", m.cpu.replace(',', " ")),
        ("reference_version", m.reference_version.clone()),
        ("ours_rev", m.ours_rev.clone()),
        ("command", run.opts.command.clone()),
    ] {
        let _ = writeln!(s, "machine,,{k},,{v},");
    }
    let mut lat = |side: &str, name: &str, st: &Stats| {
        for (metric, v) in [("median", st.median), ("p99", st.p99), ("mean", st.mean), ("min", st.min)] {
            let _ = writeln!(s, "latency,{side},{name}_{metric},,{v:.3},ms");
        }
        let _ = writeln!(s, "latency,{side},{name}_samples,,{},count", st.n);
    };
    for (side, r) in [("ours", &run.ours), ("reference", &run.reference)] {
        lat(side, "add", &r.latency.add);
        lat(side, "del", &r.latency.del);
    }
    for (name, o, r, f) in &run.chains {
        for (side, l) in [("ours", o), ("reference", r), ("floor", f)] {
            lat(side, &format!("{name}_add"), &l.add);
            lat(side, &format!("{name}_del"), &l.del);
        }
    }
    lat("floor", "add", &run.floor.netlink.add);
    lat("floor", "del", &run.floor.netlink.del);
    lat("floor+nft", "add", &run.floor.with_nft.add);
    lat("floor+nft", "del", &run.floor.with_nft.del);
    for c in &run.meta_chains {
        for (side, l) in [("ours", &c.ours), ("reference", &c.reference), ("floor", &c.floor)] {
            for (name, st) in [("add", &l.add), ("del", &l.del)] {
                for (metric, v) in [("median", st.median), ("p99", st.p99), ("mean", st.mean), ("min", st.min)] {
                    let _ = writeln!(s, "latency_chain,{side},{name}_{metric},{},{v:.3},ms", c.key);
                }
                let _ = writeln!(s, "latency_chain,{side},{name}_samples,{},{},count", c.key, st.n);
            }
        }
    }
    for (side, r) in [("ours", &run.ours), ("reference", &run.reference)] {
        for (w, pps) in &r.churn {
            let _ = writeln!(s, "churn,{side},pods_per_second,{w},{pps:.2},pods/s");
        }
        for (level, a, d) in &r.scaling {
            for (name, st) in [("add", a), ("del", d)] {
                let _ = writeln!(s, "scaling,{side},{name}_median,{level},{:.3},ms", st.median);
                let _ = writeln!(s, "scaling,{side},{name}_p99,{level},{:.3},ms", st.p99);
            }
        }
        if let Some((n, secs)) = r.teardown {
            let _ = writeln!(s, "scaling,{side},teardown_parallel,{n},{secs:.2},s");
        }
        for (level, f) in &r.level_floor {
            for (name, st) in [("add", &f.add), ("del", &f.del)] {
                let _ = writeln!(s, "scaling,floor,{name}_median,{level},{:.3},ms", st.median);
                let _ = writeln!(s, "scaling,floor,{name}_p99,{level},{:.3},ms", st.p99);
            }
        }
        for (level, plugins) in &r.level_plugins {
            for c in plugins {
                let _ = writeln!(s, "scaling_plugin,{side},{}_add_ms,{level},{:.3},ms", c.plugin, c.add_ms);
                let _ = writeln!(s, "scaling_plugin,{side},{}_del_ms,{level},{:.3},ms", c.plugin, c.del_ms);
            }
        }
        let _ = writeln!(s, "footprint,{side},installed_bytes,{},{},bytes", r.disk_all.0, r.disk_all.1);
        let _ = writeln!(s, "footprint,{side},used_plugins_bytes,4,{},bytes", r.disk_used);
        for c in &r.plugins {
            let _ = writeln!(s, "plugin,{side},{}_add_ms,,{:.3},ms", c.plugin, c.add_ms);
            let _ = writeln!(s, "plugin,{side},{}_del_ms,,{:.3},ms", c.plugin, c.del_ms);
            let _ = writeln!(s, "plugin,{side},{}_add_peak_rss,,{},KiB", c.plugin, c.add_rss_kb);
            let _ = writeln!(s, "plugin,{side},{}_del_peak_rss,,{},KiB", c.plugin, c.del_rss_kb);
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

const OURS: &str = "#d9480f";
const REF: &str = "#1c7ed6";
const FLOOR: &str = "#868e96";

/// Median bars with p99 whiskers for ADD and DEL: ours, reference, floor(+nft).
fn latency_svg(run: &Run) -> String {
    let (w, h) = (760.0, 420.0);
    let (left, right, top, bottom) = (70.0, 20.0, 70.0, 70.0);
    let groups = [("ADD", 0), ("DEL", 1)];
    let series: [(&str, &str, &crate::Latency); 3] = [
        ("cni-rs", OURS, &run.ours.latency),
        ("reference", REF, &run.reference.latency),
        ("floor (netlink + 1 nft)", FLOOR, &run.floor.with_nft),
    ];
    let pick = |l: &crate::Latency, g: usize| if g == 0 { l.add } else { l.del };
    let max = series.iter().flat_map(|(_, _, l)| [l.add.p99, l.del.p99]).fold(1.0f64, f64::max);
    let ymax = nice_ceil(max);
    let plot_h = h - top - bottom;
    let y = |v: f64| top + plot_h * (1.0 - v / ymax);
    let mut s = svg_head(w, h);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="16" font-weight="bold">Per-pod latency: bridge + host-local + portmap + loopback via libcni</text>"#,
        left
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="44" font-size="11" fill="#555">{}</text>"##,
        left,
        esc(&plot_machine_line(run))
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="58" font-size="11" fill="#555">bar = median, whisker = p99 ({} samples per side) · reproduce: {}</text>"##,
        left,
        run.ours.latency.add.n,
        esc(&run.opts.command)
    );
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{v:.0} ms</text>"##,
            w - right,
            left - 6.0,
            yy + 4.0
        );
    }
    let group_w = (w - left - right) / groups.len() as f64;
    let bar_w = group_w / 5.0;
    for (gi, (gname, g)) in groups.iter().enumerate() {
        let gx = left + group_w * gi as f64 + bar_w;
        for (si, (name, color, l)) in series.iter().enumerate() {
            let st = pick(l, *g);
            let x = gx + bar_w * si as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{name} {gname}: median {:.1} ms, p99 {:.1} ms</title></rect>"#,
                y(st.median),
                bar_w * 0.85,
                y(0.0) - y(st.median),
                st.median,
                st.p99
            );
            let cx = x + bar_w * 0.425;
            let _ = writeln!(
                s,
                r##"<line x1="{cx:.1}" x2="{cx:.1}" y1="{:.1}" y2="{:.1}" stroke="#222"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#222"/>"##,
                y(st.median),
                y(st.p99),
                cx - 5.0,
                cx + 5.0,
                y(st.p99),
                y(st.p99)
            );
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{:.1}" font-size="10" text-anchor="middle">{:.1}</text>"#,
                y(st.median) - 3.0 - if st.p99 - st.median < ymax * 0.04 { 10.0 } else { 0.0 },
                st.median
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" font-weight="bold">{gname}</text>"#,
            gx + bar_w * 1.5,
            h - bottom + 18.0
        );
    }
    for (si, (name, color, _)) in series.iter().enumerate() {
        let x = left + 190.0 * si as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{}" font-size="12">{}</text>"#,
            h - 30.0,
            x + 16.0,
            h - 20.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn nice_ceil(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn svg_head(w: f64, h: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    )
}

/// A line of the scaling plot: name, colour, dash pattern, (level, median) points.
type Series<'a> = (&'a str, &'a str, &'a str, Vec<(usize, f64)>);

/// Next-pod ADD and DEL medians against pods attached (and the floor's), log-log.
fn scaling_svg(run: &Run) -> String {
    let (w, h) = (760.0, 440.0);
    let (left, right, top, bottom) = (70.0, 190.0, 70.0, 50.0);
    let next = |r: &SideResults, add: bool| -> Vec<(usize, f64)> {
        r.scaling.iter().map(|(l, a, d)| (*l, if add { a.median } else { d.median })).collect()
    };
    let floor = |add: bool| -> Vec<(usize, f64)> {
        run.ours.level_floor.iter().map(|(l, f)| (*l, if add { f.add.median } else { f.del.median })).collect()
    };
    let mut lines: Vec<Series> = vec![
        ("cni-rs ADD", OURS, "", next(&run.ours, true)),
        ("cni-rs DEL", OURS, "6,4", next(&run.ours, false)),
        ("reference ADD", REF, "", next(&run.reference, true)),
        ("reference DEL", REF, "6,4", next(&run.reference, false)),
    ];
    if !run.ours.level_floor.is_empty() {
        lines.push(("floor ADD (netlink)", FLOOR, "", floor(true)));
        lines.push(("floor DEL (netlink)", FLOOR, "6,4", floor(false)));
    }
    let pts: Vec<(usize, f64)> = lines.iter().flat_map(|(_, _, _, p)| p.iter().copied()).collect();
    let mut s = svg_head(w, h);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="24" font-size="16" font-weight="bold">Cost of the next pod with N pods already attached (median)</text>"#
    );
    let _ =
        writeln!(s, r##"<text x="{left}" y="44" font-size="11" fill="#555">{}</text>"##, esc(&plot_machine_line(run)));
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="58" font-size="11" fill="#555">log-log · reproduce: {}</text>"##,
        esc(&run.opts.command)
    );
    if pts.is_empty() {
        s.push_str("</svg>\n");
        return s;
    }
    let xmin = pts.iter().map(|p| p.0).min().unwrap_or(1).max(1) as f64;
    let xmax = (pts.iter().map(|p| p.0).max().unwrap_or(10) as f64).max(xmin * 10.0);
    let ymin_v = pts.iter().map(|p| p.1).fold(f64::MAX, f64::min).max(0.1);
    let ymax_v = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let (ylo, yhi) = (10f64.powf(ymin_v.log10().floor()), 10f64.powf(ymax_v.log10().ceil()));
    let (pw, ph) = (w - left - right, h - top - bottom);
    let x = |v: f64| left + pw * (v.log10() - xmin.log10()) / (xmax.log10() - xmin.log10());
    let y = |v: f64| top + ph * (1.0 - (v.log10() - ylo.log10()) / (yhi.log10() - ylo.log10()));
    let mut decade = ylo;
    while decade <= yhi * 1.001 {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v > yhi * 1.001 {
                break;
            }
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{v} ms</text>"##,
                left + pw,
                y(v),
                y(v),
                left - 6.0,
                y(v) + 4.0
            );
        }
        decade *= 10.0;
    }
    let mut levels: Vec<usize> = pts.iter().map(|p| p.0).collect();
    levels.sort_unstable();
    levels.dedup();
    for l in &levels {
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{top}" y2="{:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{l}</text>"##,
            x(*l as f64),
            x(*l as f64),
            top + ph,
            x(*l as f64),
            top + ph + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">pods attached</text>"#,
        left + pw / 2.0,
        h - 12.0
    );
    for (i, (name, color, dash, points)) in lines.iter().enumerate() {
        let p: Vec<String> = points.iter().map(|(l, v)| format!("{:.1},{:.1}", x(*l as f64), y(*v))).collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            p.join(" ")
        );
        for (l, v) in points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{name} at {l}: {v:.1} ms</title></circle>"#,
                x(*l as f64),
                y(*v)
            );
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}" font-size="12">{name}</text>"#,
            left + pw + 12.0,
            left + pw + 40.0,
            left + pw + 46.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The markdown tables.
pub fn tables(run: &Run) -> String {
    let (o, r, f) = (&run.ours, &run.reference, &run.floor);
    let mut s = String::new();
    let _ = writeln!(s, "Measured {}  ", machine_line(run));
    let _ = writeln!(s, "Command: `{}` (run time {:.0} s)\n", run.opts.command, run.elapsed);
    let _ = writeln!(
        s,
        "### Per-pod latency ({} samples per side, interleaved; p99 is the largest sample below 100)\n",
        o.latency.add.n
    );
    let _ = writeln!(
        s,
        "| | cni-rs | reference | ours/ref | speedup | floor (netlink) | floor (+1 nft) | ours/floor(+nft) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, a, b, fl, fn_) in [
        ("ADD median", o.latency.add.median, r.latency.add.median, f.netlink.add.median, f.with_nft.add.median),
        ("ADD p99", o.latency.add.p99, r.latency.add.p99, f.netlink.add.p99, f.with_nft.add.p99),
        ("DEL median", o.latency.del.median, r.latency.del.median, f.netlink.del.median, f.with_nft.del.median),
        ("DEL p99", o.latency.del.p99, r.latency.del.p99, f.netlink.del.p99, f.with_nft.del.p99),
    ] {
        let _ = writeln!(
            s,
            "| {name} | {a:.1} ms | {b:.1} ms | {:.3} | {:.1}x | {fl:.1} ms | {fn_:.1} ms | {:.2}x |",
            ratio(a, b),
            ratio(b, a),
            ratio(a, fn_)
        );
    }
    if !run.chains.is_empty() {
        let _ =
            writeln!(s, "\n### Per-pod latency of other chains (each with host-local, the same conflist both sides)\n");
        let _ = writeln!(s, "| chain | | cni-rs | reference | ours/ref | speedup | floor (netlink) |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
        for (name, a, b, f) in &run.chains {
            for (what, x, y, z) in [
                ("ADD median", a.add.median, b.add.median, f.add.median),
                ("ADD p99", a.add.p99, b.add.p99, f.add.p99),
                ("DEL median", a.del.median, b.del.median, f.del.median),
                ("DEL p99", a.del.p99, b.del.p99, f.del.p99),
            ] {
                let _ = writeln!(
                    s,
                    "| {name} | {what} | {x:.1} ms | {y:.1} ms | {:.3} | {:.1}x | {z:.1} ms |",
                    ratio(x, y),
                    ratio(y, x)
                );
            }
        }
    }
    for c in &run.meta_chains {
        for (name, a, b, f) in [
            ("ADD median", c.ours.add.median, c.reference.add.median, c.floor.add.median),
            ("ADD p99", c.ours.add.p99, c.reference.add.p99, c.floor.add.p99),
            ("DEL median", c.ours.del.median, c.reference.del.median, c.floor.del.median),
            ("DEL p99", c.ours.del.p99, c.reference.del.p99, c.floor.del.p99),
        ] {
            let _ = writeln!(
                s,
                "| {}: {name} | {a:.1} ms | {b:.1} ms | {:.3} | {:.1}x | {f:.1} ms | | |",
                c.title,
                ratio(a, b),
                ratio(b, a)
            );
        }
    }
    if !run.meta_chains.is_empty() {
        let files: Vec<String> = run.meta_chains.iter().map(|c| format!("{} (`{}`)", c.title, c.file)).collect();
        let _ = writeln!(
            s,
            "\nThe chain rows run the conflists {} on both sides, in the same rotation (names, subnets \
             and IPAM directory replaced; the bandwidth chain's pods also get the `bandwidth` capability, \
             100 Mbit/s each way); their floor (netlink) is `cni-floor` doing the chain's link work: \
             the base floor's for podman, with bandwidth's ifb, qdiscs and redirect for bandwidth.",
            files.join(" and ")
        );
    }
    let _ = writeln!(s, "\n### Churn (ADD+DEL cycles, namespaces made beforehand)\n");
    let _ = writeln!(s, "| parallel pods | cni-rs | reference | ours/ref |");
    let _ = writeln!(s, "|---:|---:|---:|---:|");
    for ((w, a), (_, b)) in o.churn.iter().zip(&r.churn) {
        let _ = writeln!(s, "| {w} | {a:.1} pods/s | {b:.1} pods/s | {:.1}x |", ratio(*a, *b));
    }
    if !o.scaling.is_empty() {
        let _ = writeln!(
            s,
            "\n### Scaling: the next pod with N attached (median / p99, {} samples per level)\n",
            o.scaling[0].1.n
        );
        let _ = writeln!(s, "| N attached | cni-rs ADD | cni-rs DEL | reference ADD | reference DEL |");
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|");
        for ((l, oa, od), (_, ra, rd)) in o.scaling.iter().zip(&r.scaling) {
            let _ = writeln!(
                s,
                "| {l} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
                oa.median, oa.p99, od.median, od.p99, ra.median, ra.p99, rd.median, rd.p99
            );
        }
        if let (Some(first), Some(last)) = (o.scaling.first(), o.scaling.last()) {
            let rf = r.scaling.first().unwrap();
            let rl = r.scaling.last().unwrap();
            let _ = writeln!(
                s,
                "\nADD at {} / ADD at {}: cni-rs {:.2}x, reference {:.2}x. DEL: cni-rs {:.2}x, reference {:.2}x.",
                last.0,
                first.0,
                ratio(last.1.median, first.1.median),
                ratio(rl.1.median, rf.1.median),
                ratio(last.2.median, first.2.median),
                ratio(rl.2.median, rf.2.median)
            );
        }
        growth_table(&mut s, run);
        for (name, res) in [("cni-rs", o), ("reference", r)] {
            if let Some((n, secs)) = res.teardown {
                let _ =
                    writeln!(s, "Tearing down {n} pods with {} in parallel: {name} {secs:.1} s.  ", run.opts.parallel);
            }
        }
    }
    let _ = writeln!(s, "\n### Footprint\n");
    let _ = writeln!(s, "| | files | bytes on disk | the 4 plugins used |");
    let _ = writeln!(s, "|---|---:|---:|---:|");
    for (what, unit, side) in [("cni-rs (installed set)", "names", o), ("reference package", "files", r)] {
        let (n, bytes) = side.disk_all;
        let _ = writeln!(s, "| {what} | {n} {unit} | {bytes} ({}) | {} |", mb(bytes), mb(side.disk_used));
    }
    let _ = writeln!(
        s,
        "\n### Per plugin: mean wall time and peak RSS of the process tree (plugin and what it runs), {} pods\n",
        run.opts.breakdown
    );
    let _ = writeln!(s, "bridge includes its host-local call; host-local is also run alone with the same config.\n");
    let _ = writeln!(s, "| plugin | cni-rs ADD | reference ADD | cni-rs DEL | reference DEL | cni-rs peak RSS (ADD/DEL) | reference peak RSS (ADD/DEL) |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for (a, b) in o.plugins.iter().zip(&r.plugins) {
        let _ = writeln!(
            s,
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} / {:.1} MiB | {:.1} / {:.1} MiB |",
            a.plugin,
            a.add_ms,
            b.add_ms,
            a.del_ms,
            b.del_ms,
            a.add_rss_kb as f64 / 1024.0,
            a.del_rss_kb as f64 / 1024.0,
            b.add_rss_kb as f64 / 1024.0,
            b.del_rss_kb as f64 / 1024.0
        );
    }
    s
}

pub fn summary(run: &Run) -> String {
    let mut s = tables(run);
    s.push('\n');
    s
}

/// Where the growth from the first to the last level goes: each plugin run by hand, and the
/// netlink floor on cni-rs's bridge with its pods attached.
fn growth_table(s: &mut String, run: &Run) {
    let (o, r) = (&run.ours, &run.reference);
    let (Some((l0, o0)), Some((l1, o1))) = (o.level_plugins.first(), o.level_plugins.last()) else { return };
    let (Some((_, r0)), Some((_, r1))) = (r.level_plugins.first(), r.level_plugins.last()) else { return };
    let _ = writeln!(
        s,
        "\nWhere the ADD and DEL growth goes, {l0} -> {l1} pods attached: each plugin run by hand ({} pods per \
         level; bridge includes its host-local call, host-local is also run alone), and the netlink floor \
         (`cni-floor`, {} samples) on cni-rs's bridge with its pods attached.\n",
        run.opts.breakdown, run.opts.scale_samples
    );
    let floor = o.level_floor.first().zip(o.level_floor.last());
    for verb in ["ADD", "DEL"] {
        let pick = |c: &PluginCost| if verb == "ADD" { c.add_ms } else { c.del_ms };
        let _ = writeln!(
            s,
            "| {verb} | cni-rs at {l0} | cni-rs at {l1} | growth | reference at {l0} | reference at {l1} | growth |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        for (((a0, a1), b0), b1) in o0.iter().zip(o1).zip(r0).zip(r1) {
            let (a0v, a1v, b0v, b1v) = (pick(a0), pick(a1), pick(b0), pick(b1));
            let _ = writeln!(
                s,
                "| {} | {a0v:.2} ms | {a1v:.2} ms | {:+.2} ms | {b0v:.2} ms | {b1v:.2} ms | {:+.2} ms |",
                a0.plugin,
                a1v - a0v,
                b1v - b0v
            );
        }
        if let Some(((_, f0), (_, f1))) = floor {
            let (v0, v1) = if verb == "ADD" { (f0.add.median, f1.add.median) } else { (f0.del.median, f1.del.median) };
            let _ = writeln!(s, "| floor (netlink) | {v0:.2} ms | {v1:.2} ms | {:+.2} ms | | | |", v1 - v0);
        }
        let _ = writeln!(s);
    }
}

/// Writes results.csv, latency.svg, scaling.svg and the results block of README.md under the
/// output directory.
pub fn write(run: &Run) -> Result<Vec<PathBuf>, String> {
    let dir = &run.opts.out;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: &str, content: String| -> Result<(), String> {
        let p = dir.join(name);
        std::fs::write(&p, content).map_err(|e| format!("{}: {e}", p.display()))?;
        written.push(p);
        Ok(())
    };
    put("results.csv", csv(run))?;
    put("latency.svg", latency_svg(run))?;
    if !run.ours.scaling.is_empty() {
        put("scaling.svg", scaling_svg(run))?;
    }
    let readme = dir.join("README.md");
    let old = std::fs::read_to_string(&readme).unwrap_or_else(|_| format!("# Benchmarks\n\n{BEGIN}\n{END}\n"));
    let block = format!("{BEGIN}\n{}{END}", tables(run));
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &old[..b], block, &old[e + END.len()..]),
        _ => format!("{old}\n{block}\n"),
    };
    put("README.md", new)?;
    Ok(written)
}
