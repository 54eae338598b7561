//! The benchmark's plots, as SVG (plotters' SVG backend needs no system fonts).

use super::report::Report;
use super::results::median;
use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 6] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The series legend, top left, the same on every plot.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// A chart with one unit-wide slot per workload along x, named at its middle, and `0..y_max` up.
fn workload_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    (caption, size): (&str, u32),
    r: &Report,
    y_max: f64,
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
    root.fill(&WHITE).map_err(err)?;
    let n = r.workloads.len();
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", size))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..y_max)
        .map_err(err)?;
    let names: Vec<String> = r.workloads.iter().map(|w| w.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 && i < names.len() {
                names[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// A chart of numbers against numbers: `x` and `y` are each a range and its axis name.
fn xy_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    x: (std::ops::Range<f64>, &str),
    y: (std::ops::Range<f64>, &str),
) -> Result<Chart<'a, 'b>> {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.0, y.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x.1)
        .y_desc(y.1)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// Draws every plot into `dir`.
pub fn draw_all(dir: &Path, r: &Report) -> Result<()> {
    conversation(&dir.join("conversation_ttft.svg"), r)?;
    ttft_vs_length(&dir.join("ttft_vs_length.svg"), r)?;
    speedup(&dir.join("speedup.svg"), r)?;
    stages(&dir.join("stages.svg"), r)?;
    concurrency(&dir.join("concurrency.svg"), r)?;
    Ok(())
}

/// Tokens per second against the number of concurrent clients: output over the whole run, and
/// the clients' decode rate.
fn concurrency(path: &Path, r: &Report) -> Result<()> {
    let c = &r.concurrency;
    let points = |f: fn(&super::concurrency::ConcurrencyResult) -> f64| {
        c.iter()
            .map(|x| (x.clients as f64, f(x)))
            .collect::<Vec<_>>()
    };
    by_clients(
        path,
        ("Concurrent chats: tokens per second", "tokens/s"),
        &[
            ("output (whole run)", points(|x| x.output_tokens_per_sec)),
            ("decode (all clients)", points(|x| x.decode_tokens_per_sec)),
        ],
    )
}

/// `kvb serve` under load: TTFT percentiles, and tokens per second, against the client count.
pub fn server(dir: &Path, results: &[super::server::ServerResult]) -> Result<()> {
    let of = |constrained: bool, f: fn(&super::server::ServerResult) -> f64| {
        results
            .iter()
            .filter(|x| x.constrained == constrained)
            .map(|x| (x.clients as f64, f(x)))
            .collect::<Vec<_>>()
    };
    let points = |f| of(false, f);
    let mut rates = vec![
        ("output (whole run)", points(|x| x.output_tokens_per_sec)),
        ("decode (all clients)", points(|x| x.decode_tokens_per_sec)),
    ];
    let json = of(true, |x| x.decode_tokens_per_sec);
    if !json.is_empty() {
        rates.push(("decode, JSON schema (all clients)", json));
    }
    by_clients(
        &dir.join("ttft.svg"),
        ("kvb serve: time to first token", "ms"),
        &[
            ("p50, all turns", points(|x| x.ttft_p50_ms)),
            ("p99, all turns", points(|x| x.ttft_p99_ms)),
            ("p50, warm turns", points(|x| x.warm_ttft_p50_ms)),
        ],
    )?;
    by_clients(
        &dir.join("throughput.svg"),
        ("kvb serve: tokens per second", "tokens/s"),
        &rates,
    )
}

/// Lines of (clients, value) points, one per named series, from 0 up.
fn by_clients(
    path: &Path,
    (caption, y_desc): (&str, &str),
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<()> {
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (x_max, y_max) = all.fold((1.0f64, 1.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let mut chart = xy_chart(
        &root,
        caption,
        (0f64..x_max * 1.1, "concurrent clients"),
        (0f64..y_max * 1.15, y_desc),
    )?;
    for (i, (name, points)) in series.iter().enumerate() {
        let col = color(i + 1);
        chart
            .draw_series(LineSeries::new(points.clone(), col.stroke_width(2)))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 4, col.filled())))
            .map_err(err)?;
    }
    legend(&mut chart)?;
    root.present().map_err(err)
}

/// TTFT per turn of the conversation, one line per variant.
fn conversation(path: &Path, r: &Report) -> Result<()> {
    let Some(w) = r.workload("conversation") else {
        return Ok(());
    };
    let turns = w.requests.len();
    let y_max = w
        .requests
        .iter()
        .flat_map(|q| q.cells.values().map(|c| c.ttft_ms))
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let mut chart = xy_chart(
        &root,
        "Conversation: TTFT per turn",
        (0.5f64..turns as f64 + 0.5, "turn"),
        (0f64..y_max, "TTFT (ms)"),
    )?;
    for (i, v) in r.variants.iter().enumerate() {
        let points: Vec<(f64, f64)> = w
            .requests
            .iter()
            .enumerate()
            .filter_map(|(t, q)| q.cells.get(v).map(|c| ((t + 1) as f64, c.ttft_ms)))
            .collect();
        let c = color(i);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(v.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// TTFT against prompt length for every request: Baseline's cost grows with the prompt, warm
/// reuse's with the new tokens only; where the lines cross is the break-even.
fn ttft_vs_length(path: &Path, r: &Report) -> Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = [0usize, 2]
        .iter()
        .filter_map(|&i| r.variants.get(i))
        .map(|v| {
            let mut pts: Vec<(f64, f64)> = r
                .workloads
                .iter()
                .flat_map(|w| {
                    let all: Vec<&_> = if v == &r.variants[0] {
                        w.requests.iter().collect()
                    } else {
                        w.warm()
                    };
                    all.iter()
                        .filter_map(|q| q.cells.get(v).map(|c| (q.prompt_tokens as f64, c.ttft_ms)))
                        .collect::<Vec<_>>()
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (v.clone(), pts)
        })
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max)
        * 1.05;
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let mut chart = xy_chart(
        &root,
        "TTFT vs prompt length",
        (0f64..x_max, "prompt tokens"),
        (0f64..y_max, "TTFT (ms)"),
    )?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = color(if i == 0 { 0 } else { 2 });
        let label = if i == 0 {
            name.clone()
        } else {
            format!("{name} (warm requests)")
        };
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Median speedup of warm requests over Baseline, per workload and variant (grouped bars).
fn speedup(path: &Path, r: &Report) -> Result<()> {
    let variants = &r.variants[1..];
    let n = r.workloads.len();
    let values: Vec<Vec<f64>> = r
        .workloads
        .iter()
        .map(|w| {
            let base = w.warm_median(&r.variants[0], |c| c.ttft_ms);
            variants
                .iter()
                .map(|v| base / w.warm_median(v, |c| c.ttft_ms).max(1e-9))
                .collect()
        })
        .collect();
    let y_max = values.iter().flatten().fold(1.0f64, |a, &b| a.max(b)) * 1.15;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    let mut chart = workload_chart(
        &root,
        ("Speedup of TTFT over Baseline (warm requests, median)", 22),
        r,
        y_max,
        "speedup (x)",
    )?;
    let width = 0.8 / variants.len() as f64;
    for (vi, v) in variants.iter().enumerate() {
        let c = color(vi + 1);
        chart
            .draw_series(values.iter().enumerate().map(|(wi, vals)| {
                let x0 = wi as f64 + 0.1 + vi as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, vals[vi])], c.filled())
            }))
            .map_err(err)?
            .label(v.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (n as f64, 1.0)],
            BLACK.stroke_width(1),
        )))
        .map_err(err)?;
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Where the time to first token goes: stacked stage medians of warm requests, per workload,
/// for Baseline and ChunkReuse (selective) side by side.
fn stages(path: &Path, r: &Report) -> Result<()> {
    let shown = [r.variants[0].clone(), r.variants[2].clone()];
    let bars: Vec<Vec<[(&str, f64); 5]>> = r
        .workloads
        .iter()
        .map(|w| {
            shown
                .iter()
                .map(|v| {
                    let cells: Vec<_> = w.warm().iter().filter_map(|q| q.cells.get(v)).collect();
                    let m = |f: fn(&super::results::Stages) -> f64| {
                        median(&cells.iter().map(|c| f(&c.stages)).collect::<Vec<_>>())
                    };
                    let s = super::results::Stages {
                        tokenize_ms: m(|s| s.tokenize_ms),
                        lookup_ms: m(|s| s.lookup_ms),
                        assemble_ms: m(|s| s.assemble_ms),
                        repair_ms: m(|s| s.repair_ms),
                        live_prefill_ms: m(|s| s.live_prefill_ms),
                        ..Default::default()
                    };
                    s.to_first_token()
                })
                .collect()
        })
        .collect();
    let y_max = bars
        .iter()
        .flatten()
        .map(|b| b.iter().map(|s| s.1).sum::<f64>())
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    let caption = format!(
        "Stages before the first token (warm requests): left {}, right {}",
        shown[0], shown[1]
    );
    let mut chart = workload_chart(&root, (&caption, 18), r, y_max, "ms")?;
    let stage_names = bars
        .first()
        .and_then(|b| b.first())
        .map(|s| s.map(|x| x.0))
        .unwrap_or_default();
    for (si, stage) in stage_names.iter().enumerate() {
        let c = color(si);
        let mut rects = Vec::new();
        for (wi, per_variant) in bars.iter().enumerate() {
            for (vi, b) in per_variant.iter().enumerate() {
                let below: f64 = b[..si].iter().map(|s| s.1).sum();
                let x0 = wi as f64 + 0.1 + vi as f64 * 0.42;
                rects.push(Rectangle::new(
                    [(x0, below), (x0 + 0.38, below + b[si].1)],
                    c.filled(),
                ));
            }
        }
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*stage)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One curve of the fidelity bench: its name and `(share recomputed, y)` points.
pub type Curve = (String, Vec<(f64, f64)>);

/// Fidelity against the share of reused tokens recomputed: one line per budget (fixed, adaptive,
/// gradual), and the noise floor's levels as dashed horizontal lines, for one measure `y`.
pub fn fidelity(
    path: &Path,
    (caption, y_desc): (&str, &str),
    curves: &[Curve],
    floor: &[(String, f64)],
) -> Result<()> {
    let ys = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .chain(floor.iter().map(|f| f.1));
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
        (lo.min(y), hi.max(y))
    });
    let pad = (hi - lo).max(1e-9) * 0.08;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let mut chart = xy_chart(
        &root,
        caption,
        (0f64..0.55, "share of reused tokens recomputed"),
        ((lo - pad)..(hi + pad), y_desc),
    )?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let c = color(i + 1);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    for (i, (name, y)) in floor.iter().enumerate() {
        let c = color(i + 4);
        let y = *y;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y), (0.55, y)],
                6,
                4,
                c.stroke_width(1),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, yy)| {
                PathElement::new(vec![(x, yy), (x + 20, yy)], c.stroke_width(1))
            });
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}
